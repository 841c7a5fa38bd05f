"""What the kernels of an environment have: each language with its kernel and version, and
each language's installed packages with their versions.

``python -m kernels.environment [--profile NAME] [--image TAG]`` prints it as JSON (the
shape of `gateway.models.environment.Environment`). docker/Dockerfile runs it in the image
it builds and bakes the answer in as /opt/gateway/environment.json, which the Docker backend
reads from the image; the local backend runs it with the Python its kernels run with. It
asks the environment itself (importlib.metadata, `deno --version`, R's
`installed.packages()`), so the list is what a kernel would find, never a list kept by hand.

Standard library only, every subprocess bounded: it runs in the kernel image's Python.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

TIMEOUT = 60.0  # seconds for each subprocess (R lists its packages in well under one)
# The commands bash runs that the gateway's manual names, and the Python of the kernels.
BASH_TOOLS = ("python3", "deno", "git", "R", "Rscript")
R_SCRIPT = Path(__file__).resolve().parent / "r" / "environment.R"

Package = dict[str, str]


def _run(argv: list[str]) -> str | None:
    """The command's stdout, or None when it is missing, fails or takes too long."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _first_version(text: str | None) -> str | None:
    if not text:
        return None
    found = re.search(r"\d+(?:\.\d+)+(?:[-.+~][0-9A-Za-z.]+)?", text)
    return found.group(0) if found else None


def python_packages() -> list[Package]:
    """Every distribution installed in this Python's environment, by name."""
    seen: dict[str, Package] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()
        seen.setdefault(key, {"name": name, "version": dist.version})
    return sorted(seen.values(), key=lambda p: p["name"].lower())


def python_language() -> dict[str, Any]:
    try:
        kernel_version: str | None = importlib.metadata.version("ipykernel")
    except importlib.metadata.PackageNotFoundError:
        kernel_version = None
    return {
        "kernel": "ipykernel",
        "kernel_version": kernel_version,
        "version": platform.python_version(),
        "packages": python_packages(),
    }


def deno_binary() -> str | None:
    beside = Path(sys.executable).parent / "deno"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("deno")


def deno_languages() -> dict[str, dict[str, Any]]:
    """JavaScript and TypeScript, both in Deno's kernel: no packages are installed (npm: and
    jsr: imports would need the network); `node:` built-ins are part of Deno."""
    binary = deno_binary()
    text = _run([binary, "--version"]) if binary else None
    if not text:
        return {}
    versions = {}
    for line in text.splitlines():
        name, _, rest = line.strip().partition(" ")
        versions[name.lower()] = _first_version(rest)
    deno = versions.get("deno")
    return {
        "javascript": {
            "kernel": "deno",
            "kernel_version": deno,
            "version": versions.get("v8") and f"V8 {versions['v8']}",
            "packages": [],
        },
        "typescript": {
            "kernel": "deno",
            "kernel_version": deno,
            "version": versions.get("typescript"),
            "packages": [],
        },
    }


def bash_language() -> dict[str, Any] | None:
    bash = shutil.which("bash")
    if bash is None:
        return None
    tools: list[Package] = []
    for tool in BASH_TOOLS:
        path = deno_binary() if tool == "deno" else shutil.which(tool)
        if path is None:
            continue
        version = _first_version(_run([path, "--version"]))
        tools.append({"name": tool, "version": version or "unknown"})
    return {
        "kernel": "bash",
        "kernel_version": None,
        "version": _first_version(_run([bash, "--version"])),
        "packages": tools,
    }


def r_language() -> dict[str, Any] | None:
    """R through IRkernel, when R is installed and IRkernel with it (R's own script lists
    every installed package; None without R or IRkernel)."""
    rscript = shutil.which("Rscript")
    if rscript is None or not R_SCRIPT.is_file():
        return None
    text = _run([rscript, "--vanilla", str(R_SCRIPT)])
    if not text:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    packages = [
        {"name": str(p["name"]), "version": str(p["version"])}
        for p in found.get("packages", [])
        if isinstance(p, dict) and "name" in p and "version" in p
    ]
    versions = {p["name"]: p["version"] for p in packages}
    if "IRkernel" not in versions:
        return None
    return {
        "kernel": "IRkernel",
        "kernel_version": versions["IRkernel"],
        "version": str(found.get("version") or "") or None,
        "packages": sorted(packages, key=lambda p: p["name"].lower()),
    }


def collect(profile: str | None = None, image: str | None = None) -> dict[str, Any]:
    languages: dict[str, Any] = {"python": python_language()}
    bash = bash_language()
    if bash is not None:
        languages["bash"] = bash
    languages.update(deno_languages())
    r = r_language()
    if r is not None:
        languages["r"] = r
    return {
        "profile": profile,
        "image": image,
        "collected_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "languages": languages,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.environment", description=__doc__)
    parser.add_argument("--profile", default=None, help="the image profile it was built with")
    parser.add_argument("--image", default=None, help="the image's name")
    parser.add_argument("--require", default="", help="languages that must be found (a,b)")
    args = parser.parse_args(argv)
    found = collect(args.profile, args.image)
    missing = [n for n in args.require.split(",") if n and n not in found["languages"]]
    if missing:
        print(f"kernels.environment: not found: {', '.join(missing)}", file=sys.stderr)
        return 1
    json.dump(found, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
