"""The committed bundle (gateway/static/dist) is what its sources and package-lock.json build.

Two checks. Without Node, in milliseconds: the manifest's hash of every input (the sources in
gateway/static/src, package-lock.json, the build script) is recomputed, and the files it names
have the bytes it says, so that a source or lockfile changed without a rebuild fails here.
With Node and the locked packages installed (scripts/setup.sh test runs `scripts/page.sh
install`), the bundle is rebuilt offline and compared byte for byte (esbuild's output is
deterministic), so that a bundle edited by hand, or built from other packages, fails too.
The second check belongs to the page's tests: missing Node is a skip, or a failure under
GATEWAY_REQUIRE=chromium (as in CI).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess

import pytest

from tests import needs
from tests.support import REPO

pytestmark = pytest.mark.fast

SOURCES = REPO / "gateway" / "static" / "src"
DIST = REPO / "gateway" / "static" / "dist"
INPUT_FILES = ["package-lock.json", "scripts/page-bundle.mjs"]


def inputs_hash() -> str:
    """As scripts/page-bundle.mjs's `inputsHash`: "path\\0sha256(content)\\n" per input, by path."""
    paths = INPUT_FILES + [
        path.relative_to(REPO).as_posix() for path in SOURCES.rglob("*") if path.is_file()
    ]
    lines = "".join(
        f"{path}\0{hashlib.sha256((REPO / path).read_bytes()).hexdigest()}\n"
        for path in sorted(paths)
    )
    return hashlib.sha256(lines.encode()).hexdigest()


def test_the_bundle_is_built_from_the_committed_sources_and_lockfile() -> None:
    manifest = json.loads((DIST / "manifest.json").read_text())
    assert manifest["inputs_sha256"] == inputs_hash(), (
        "gateway/static/src, package-lock.json or scripts/page-bundle.mjs changed since "
        "gateway/static/dist was built: run scripts/page.sh build and commit gateway/static/dist"
    )
    on_disk = {path.name for path in DIST.iterdir()} - {"manifest.json"}
    assert on_disk == set(manifest["files"]), "gateway/static/dist holds other files than built"
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((DIST / name).read_bytes()).hexdigest() == digest, name
    for key in ("script", "style", "vendor", "vendor_style"):
        assert manifest[key] in manifest["files"]
    frame = hashlib.sha256((SOURCES / "frame.css").read_bytes()).digest()
    assert manifest["frame_style_sha256"] == base64.b64encode(frame).decode()


def test_the_bundle_rebuilds_byte_for_byte_from_the_lockfile() -> None:
    if shutil.which("node") is None:
        needs.missing("chromium", "node is missing: the page's bundle cannot be rebuilt")
    lock = hashlib.sha256((REPO / "package-lock.json").read_bytes()).hexdigest()[:16]
    if not (REPO / "node_modules" / f".installed-{lock}").exists():
        needs.missing(
            "chromium", "node_modules lacks package-lock.json's packages (scripts/page.sh install)"
        )
    done = subprocess.run(
        [str(REPO / "scripts" / "page.sh"), "check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr + done.stdout
