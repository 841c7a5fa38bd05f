"""The images' HEALTHCHECK: `GET /v1/health` on this container's own port, alive when it
answers (200, or 503 while the gateway cannot reach its store or drains: the container is
alive, and replacing every replica while the store restarts would only make it worse; the
load balancer's own check wants 200 before it sends a replica work).

The gateway's port is GATEWAY_PORT (deploy/stack.yaml: one per task slot); the load
balancer's is LB_PORT, asked at `/lb-health` (HAProxy's monitor URI).
"""

import os
import sys
import urllib.error
import urllib.request

if "LB_PORT" in os.environ:
    URL = f"http://127.0.0.1:{os.environ['LB_PORT']}/lb-health"
else:
    URL = f"http://127.0.0.1:{os.environ.get('GATEWAY_PORT', '8888')}/v1/health"

try:
    with urllib.request.urlopen(URL, timeout=4) as answer:  # noqa: S310 (loopback only)
        sys.exit(0 if answer.status == 200 else 1)
except urllib.error.HTTPError as exc:  # answered, not 200
    sys.exit(0 if exc.code == 503 and "LB_PORT" not in os.environ else 1)
except OSError as exc:
    print(f"{URL}: {exc}", file=sys.stderr)
    sys.exit(1)
