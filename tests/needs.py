"""What the suite needs from the machine, and what happens when it is missing.

A part that is missing is a skip that names it, unless the environment says it is required:
`GATEWAY_REQUIRE=docker,forkserver,chromium,schemathesis,postgres,cgroups` (or
`GATEWAY_REQUIRE_DOCKER=1` and the like; `cgroups`: this process may make cgroups, as the
local backend does as root),
as CI sets it, turns each such skip into a failure, so that CI cannot go green with a part of
the suite silently not run.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

FEATURES = ("docker", "forkserver", "chromium", "schemathesis", "postgres", "cgroups")


def required() -> set[str]:
    wanted = {part.strip().lower() for part in os.environ.get("GATEWAY_REQUIRE", "").split(",")}
    wanted |= {f for f in FEATURES if os.environ.get(f"GATEWAY_REQUIRE_{f.upper()}") == "1"}
    unknown = wanted - set(FEATURES) - {""}
    if unknown:
        raise ValueError(f"GATEWAY_REQUIRE names unknown parts: {sorted(unknown)}")
    return wanted & set(FEATURES)


def missing(feature: str, why: str) -> NoReturn:
    """Skip (or, where `feature` is required, fail) the test or module: `why` is missing."""
    assert feature in FEATURES, feature
    if feature in required():
        pytest.fail(f"GATEWAY_REQUIRE includes {feature}, but {why}", pytrace=False)
    pytest.skip(f"{feature} is not available here: {why}", allow_module_level=True)


def import_module(name: str, feature: str, hint: str) -> ModuleType:
    """`importlib.import_module(name)`, or `missing(feature, ...)`."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(feature, f"{name} cannot be imported ({exc}); {hint}")
