"""What a test gateway's kernels have (`GET /v1/environment`), and the skip (or failure) when
a test needs what they lack.

The Docker backend's default image (docker/build.sh's datascience profile) has R and the
scientific stack; a minimal image lacks them, and so does the local backend unless this
machine has R and IRkernel installed and the packages in the venv. A test that needs them
is skipped there with a reason; on Docker, under GATEWAY_REQUIRE=docker (CI, which builds
the default image), it fails instead, since the image it tests should have them.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import needs
from tests.support import DOCKER_IMAGE, GatewayThread

_SEEN: dict[int, dict[str, Any]] = {}


def environment(gateway: GatewayThread) -> dict[str, Any]:
    """The gateway's answer to GET /v1/environment (asked once per gateway)."""
    if id(gateway) not in _SEEN:
        response = gateway.client().request("GET", "/v1/environment")
        assert response.status == 200, response.body[:500]
        _SEEN[id(gateway)] = response.json()
    return _SEEN[id(gateway)]


def packages(gateway: GatewayThread, language: str) -> dict[str, str]:
    entry = environment(gateway)["languages"].get(language) or {}
    return {p["name"].lower(): p["version"] for p in entry.get("packages", [])}


def require(gateway: GatewayThread, language: str, *names: str) -> None:
    """Skip (fail on Docker under GATEWAY_REQUIRE=docker) unless the gateway's kernels have
    `language` and its packages `names`."""
    have = environment(gateway)["languages"]
    missing = [] if language in have else [language]
    if not missing:
        found = packages(gateway, language)
        missing = [name for name in names if name.lower() not in found]
    if not missing:
        return
    what = ", ".join(missing)
    if gateway.backend_name == "docker":
        needs.missing(
            "docker",
            f"the kernel image {DOCKER_IMAGE} has no {what} (docker/build.sh builds the "
            "datascience profile by default; a --profile minimal image lacks it)",
        )
    how = (
        "apt-get install r-base-core r-cran-irkernel r-cran-ggplot2 r-cran-jsonlite"
        if language == "r"
        else f"pip install {' '.join(missing)} into the venv"
    )
    pytest.skip(f"the local backend's kernels have no {what}: they run from this machine ({how})")
