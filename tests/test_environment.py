"""GET /v1/environment (issue 23): the languages a gateway's kernels have, their kernels and
installed packages, as the kernels' environment itself says (the kernel image lists its own
when it is built; the local backend asks the Python its kernels run with). The expected
versions come from elsewhere than the gateway: this venv's metadata for the local backend,
the pins of docker/requirements*.txt for the image."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
from pathlib import Path

import anyio
import pytest

from gateway.client import GatewayClient, Unauthorized
from gateway.commands.mcp import tool_description
from gateway.models.environment import Environment, LanguageEnvironment, Package
from tests.conftest import start_gateway
from tests.support import DOCKER_IMAGE, REPO, Client, GatewayThread, write_tokens
from tests.test_mcp import stdio_session

DOCKER = REPO / "docker"


def pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a requirements file and the files it includes."""
    found: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("-r "):
            found.update(pins(path.parent / line[3:].strip()))
        elif "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            found[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return found


def by_name(entry: dict[str, object]) -> dict[str, str]:
    packages = entry["packages"]
    assert isinstance(packages, list)
    return {re.sub(r"[-_.]+", "-", p["name"]).lower(): p["version"] for p in packages}


def test_the_local_backend_lists_the_environment_its_kernels_run_from(
    local_client: Client,
) -> None:
    response = local_client.request("GET", "/v1/environment")
    assert response.status == 200
    env = response.json()
    assert (env["backend"], env["source"]) == ("local", "local")
    python = env["languages"]["python"]
    assert (python["kernel"], python["kernel_version"]) == (
        "ipykernel",
        importlib.metadata.version("ipykernel"),
    )
    packages = by_name(python)
    for name in ("numpy", "pandas", "matplotlib", "ipykernel"):
        assert packages[name] == importlib.metadata.version(name)
    deno = importlib.metadata.version("deno")
    for language in ("javascript", "typescript"):
        assert env["languages"][language]["kernel"] == "deno"
        assert env["languages"][language]["kernel_version"] == deno
        assert env["languages"][language]["packages"] == []
    assert {"python3", "deno", "git"} <= set(by_name(env["languages"]["bash"]))
    if shutil.which("R") is None:  # R is the machine's, not the venv's
        assert "r" not in env["languages"]


def test_the_docker_backend_lists_what_the_image_holds(gateway: GatewayThread) -> None:
    if gateway.backend_name != "docker":
        pytest.skip("the image's list: Docker only (the local one is tested above)")
    env = gateway.client().request("GET", "/v1/environment").json()
    assert (env["backend"], env["source"], env["image"]) == ("docker", "image", DOCKER_IMAGE)
    assert env["profile"] in ("minimal", "datascience")
    expected = pins(DOCKER / "requirements.txt")
    if env["profile"] == "datascience":
        expected.update(pins(DOCKER / "requirements-datascience.txt"))
    packages = by_name(env["languages"]["python"])
    assert {name: packages.get(name) for name in expected} == expected
    assert env["languages"]["python"]["kernel_version"] == expected["ipykernel"]
    assert env["languages"]["javascript"]["kernel_version"] == expected["deno"]
    assert env["languages"]["python"]["version"].startswith("3.11.")
    if env["profile"] == "datascience":
        r = env["languages"]["r"]
        assert r["kernel"] == "IRkernel" and r["version"].startswith("4.")
        assert {"irkernel", "ggplot2", "jsonlite"} <= set(by_name(r))
    else:
        assert "r" not in env["languages"]


def test_it_needs_a_token_where_the_gateway_has_tokens(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path, {"env-token-0123456789": ("ann", "user")})
    server = start_gateway("local", tokens=tokens)
    try:
        assert server.client().request("GET", "/v1/environment").status == 401
        answer = server.client("env-token-0123456789").request("GET", "/v1/environment")
        assert answer.status == 200 and "python" in answer.json()["languages"]
        url = f"http://127.0.0.1:{server.port}"
        with GatewayClient(url) as anonymous, pytest.raises(Unauthorized):
            anonymous.environment()
        with GatewayClient(url, token="env-token-0123456789") as client:
            typed = client.environment()
        assert isinstance(typed, Environment)
        assert typed.model_dump(mode="json", exclude_none=True) == {
            k: v for k, v in answer.json().items() if v is not None
        }
    finally:
        server.stop()


def sample_environment() -> Environment:
    def language(kernel: str, version: str, *packages: tuple[str, str]) -> LanguageEnvironment:
        return LanguageEnvironment(
            kernel=kernel,
            version=version,
            packages=[Package(name=n, version=v) for n, v in packages],
        )

    return Environment(
        backend="docker",
        source="image",
        languages={
            "python": language(
                "ipykernel", "3.11.2", ("numpy", "2.4.6"), ("scikit-learn", "1.9.1")
            ),
            "bash": language("bash", "5.2.15"),
            "r": language("IRkernel", "4.2.2", ("ggplot2", "3.4.1"), ("utils", "4.2.2")),
        },
    )


def test_the_mcp_tool_says_which_languages_and_packages_there_are() -> None:
    text = tool_description(sample_environment())
    assert text.startswith("Run Python, bash or R code")
    assert "JavaScript" not in text  # not in this environment
    assert "Python 3.11.2 has numpy 2.4.6, scikit-learn 1.9.1" in text
    assert "R 4.2.2 has ggplot2 3.4.1" in text and "utils" not in text
    assert "no pip install" in text


def test_the_mcp_server_describes_its_gateways_environment() -> None:
    gateway = GatewayThread(backend="local").start()
    numpy = importlib.metadata.version("numpy")

    async def scenario() -> None:
        async with stdio_session("--url", f"http://127.0.0.1:{gateway.port}") as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            tool = tools["run_code"]
            assert tool.description is not None
            assert tool.description.startswith("Run Python, bash, JavaScript")
            assert f"numpy {numpy}" in tool.description
            assert "no pip install" in tool.description

    try:
        anyio.run(scenario)
    finally:
        gateway.stop()
