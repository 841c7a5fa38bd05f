"""The images' HEALTHCHECK: `GET /v1/health` on this container's own port (exit 0 on 200).

The gateway's port is GATEWAY_PORT (deploy/stack.yaml: one per task slot); the load
balancer's is LB_PORT, asked at `/lb-health` (HAProxy's monitor URI).
"""

import os
import sys
import urllib.request

if "LB_PORT" in os.environ:
    URL = f"http://127.0.0.1:{os.environ['LB_PORT']}/lb-health"
else:
    URL = f"http://127.0.0.1:{os.environ.get('GATEWAY_PORT', '8888')}/v1/health"

try:
    with urllib.request.urlopen(URL, timeout=4) as answer:  # noqa: S310 (loopback only)
        sys.exit(0 if answer.status == 200 else 1)
except OSError as exc:
    print(f"{URL}: {exc}", file=sys.stderr)
    sys.exit(1)
