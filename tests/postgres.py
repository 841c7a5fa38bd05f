"""A real PostgreSQL for the tests: one server per test session, started by
`.ci/postgres-up.sh` in a temporary folder of its own (never the machine's own cluster), and
a fresh database for each test that asks, dropped after it. Missing server binaries are a
skip naming them, or a failure when GATEWAY_REQUIRE includes postgres."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests import census, needs
from tests.support import REPO

UP = REPO / ".ci" / "postgres-up.sh"
DOWN = REPO / ".ci" / "postgres-down.sh"


def server_binaries() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


class Server:
    """The session's PostgreSQL: `dsn` names the `gateway` database of the role `gateway`,
    which may create databases."""

    def __init__(self) -> None:
        if server_binaries() is None:
            needs.missing(
                "postgres",
                "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb); "
                "run .ci/postgres-up.sh as root once to install Debian's postgresql",
            )
        self.state = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
        self.env = {**os.environ, "GATEWAY_POSTGRES_DIR": str(self.state)}
        try:
            self.dsn = self._up()
        except BaseException:
            self.stop()
            raise

    def _up(self) -> str:
        done = subprocess.run(
            [str(UP)], env=self.env, capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"postgres-up.sh failed: {done.stderr[-3000:]}")
        pid = int((self.state / "pid").read_text().strip())
        census.own(pid, "the tests' PostgreSQL server")
        return done.stdout.strip().splitlines()[-1]

    def pause(self) -> None:
        """Stop the server (fast: connections are cut); `resume` starts it again."""
        subprocess.run([str(DOWN)], env=self.env, capture_output=True, timeout=120, check=True)

    def resume(self) -> None:
        assert self._up() == self.dsn  # the same port

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """The server's processes stopped (SIGSTOP) inside the block: connections are
        accepted by the kernel and nothing answers, as behind a network that drops packets."""
        root = int((self.state / "pid").read_text().strip())
        children = subprocess.run(
            ["pgrep", "-P", str(root)], capture_output=True, text=True, check=False
        ).stdout.split()
        stopped = [root, *map(int, children)]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        subprocess.run([str(DOWN)], env=self.env, capture_output=True, timeout=120, check=False)
        shutil.rmtree(self.state, ignore_errors=True)

    def dsn_of(self, database: str) -> str:
        return self.dsn.rsplit("/", 1)[0] + "/" + database

    @contextmanager
    def database(self) -> Iterator[str]:
        """A new empty database for one test (its DSN), dropped after it."""
        import psycopg

        name = "t_" + secrets.token_hex(6)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        try:
            yield self.dsn_of(name)
        finally:
            self._drop(name)

    def _drop(self, name: str) -> None:
        """DROP DATABASE ... WITH (FORCE), which refuses while an autovacuum worker is in
        it (the role may not end that process; after a test that wrote gigabytes, one
        often is): tried again until the worker is done, as it soon is."""
        import psycopg

        deadline = time.monotonic() + 120
        while True:
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                return
            except psycopg.errors.InsufficientPrivilege:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
