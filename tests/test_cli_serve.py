"""`scripts/serve.sh`, the README's first command: it starts the gateway on
127.0.0.1:8888 (`gateway serve`'s own defaults), on `$PORT` when set, and passes the user's
`--port` and `--host` as they are, once (it added its own `--port 8888` before them).

The script runs as it is, from a copy of the checkout's layout whose `scripts/setup.sh` does
nothing (the real one installs the gateway into `.venv`) and whose `.venv/bin/python` prints
the arguments it is given, or, for the one real start, is the environment's Python."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.settings import Settings
from tests import census
from tests.support import REPO, Client, answers, free_port, new_instance_id, wait_for

SERVE = ["-m", "gateway", "serve"]


def checkout(folder: Path, python: str) -> Path:
    """A copy of the checkout's layout for scripts/serve.sh: its script, a setup.sh that
    does nothing, and `.venv/bin/python` as the script `python` (bash)."""
    (folder / "scripts").mkdir(parents=True)
    (folder / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "serve.sh", folder / "scripts" / "serve.sh")
    for path, text in (
        (folder / "scripts" / "setup.sh", "#!/usr/bin/env bash\nexit 0\n"),
        (folder / ".venv" / "bin" / "python", f"#!/usr/bin/env bash\n{python}\n"),
    ):
        path.write_text(text)
        path.chmod(0o755)
    return folder / "scripts" / "serve.sh"


def environment(**extra: str) -> dict[str, str]:
    names = ("PORT", "HOST")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_") and k not in names}
    return {**env, **extra}


def arguments(tmp_path: Path, *args: str, **env: str) -> list[str]:
    """What scripts/serve.sh ARGS passes to the gateway's Python."""
    serve = checkout(tmp_path / "checkout", 'printf "%s\\n" "$@"')
    done = subprocess.run(
        [str(serve), *args],
        env=environment(**env),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.fast
@pytest.mark.parametrize(
    ("args", "env", "passed"),
    [
        ((), {}, []),
        ((), {"PORT": "9100"}, ["--port", "9100"]),
        (("--port", "9000"), {}, ["--port", "9000"]),
        (("--port", "9000"), {"PORT": "9100"}, ["--port", "9000"]),
        (("--port=9000",), {"PORT": "9100"}, ["--port=9000"]),
        (("--host", "0.0.0.0", "--port", "9000"), {}, ["--host", "0.0.0.0", "--port", "9000"]),
        (("--backend", "docker"), {"PORT": "9100"}, ["--port", "9100", "--backend", "docker"]),
    ],
)
def test_the_users_port_and_host_are_passed_once(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], passed: list[str]
) -> None:
    assert arguments(tmp_path, *args, **env) == [*SERVE, *passed]


@pytest.mark.fast
def test_without_flags_the_gateway_starts_on_127_0_0_1_8888() -> None:
    """What the README promises of `scripts/serve.sh` alone: `gateway serve`'s defaults."""
    fields = Settings.model_fields
    assert (fields["host"].default, fields["port"].default) == ("127.0.0.1", 8888)


def test_serve_sh_with_a_port_starts_the_gateway_there(tmp_path: Path) -> None:
    """A real start: `scripts/serve.sh --port N` (with $PORT set too) answers on N, its
    command line naming the port once."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    serve = checkout(tmp_path / "checkout", f'exec {sys.executable} "$@"')
    port = free_port()
    instance = new_instance_id("local")
    flags = ["--port", str(port), "--backend", "local", "--data-dir", str(data_dir)]
    flags += ["--instance-id", instance, "--pool-python", "0", "--pool-bash", "0"]
    flags += ["--pool-deno", "0"]
    with (data_dir / "gateway.log").open("ab") as log:
        process = subprocess.Popen(
            [str(serve), *flags], env=environment(PORT="1"), stdout=log, stderr=log
        )
    census.own(process.pid, f"scripts/serve.sh's gateway on port {port}")
    census.PROCESS_INSTANCES[instance] = process
    try:
        up = wait_for(lambda: answers(Client(port)), timeout=60)
        assert up, (data_dir / "gateway.log").read_text()[-3000:]
        command = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
        assert command.count(b"--port") == 1
        assert command[command.index(b"--port") + 1] == str(port).encode()
    finally:
        process.terminate()
        process.wait(60)
