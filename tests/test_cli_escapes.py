"""`gateway run` must not let a run drive the terminal of whoever reads its output
(issue 8, item 13): escape sequences and control characters are removed unless `--raw`.
The command line only speaks HTTP and the sequences pass any backend alike: local."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from gateway.terminal import strip_colors, terminal_safe
from tests.conftest import start_gateway
from tests.support import GatewayThread, serving

pytestmark = pytest.mark.attack

# What a hostile run prints: a window title (OSC 0), a clipboard write (OSC 52), a screen
# clear and cursor move (CSI), a DCS string, an 8-bit CSI, a bell, a backspace and SO.
HOSTILE = (
    "\x1b]0;pwned\x07"
    "\x1b]52;c;ZWNobyBwd25lZA==\x1b\\"
    "\x1b[2J\x1b[H"
    "\x1bPq#0;2;0;0;0\x1b\\"
    "\x9b31m"
    "\x07\x08\x0e"
    "\x1bc"
)
SCRIPT = f"""
import sys
print({("before" + HOSTILE + "after")!r})
print({("err" + HOSTILE + "!")!r}, file=sys.stderr)
raise ValueError({("bad" + HOSTILE)!r})
"""


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("local"))


def gateway_run(server: GatewayThread, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    command = [sys.executable, "-m", "gateway", "run", *args]
    command += ["--url", f"http://127.0.0.1:{server.port}"]
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def assert_inert(text: str) -> None:
    controls = [c for c in text if (ord(c) < 32 and c not in "\t\n\r") or 0x7F <= ord(c) < 0xA0]
    assert not controls, f"control characters reach the terminal: {controls!r}"


def test_a_script_cannot_drive_the_terminal(server: GatewayThread, tmp_path: Path) -> None:
    (tmp_path / "hostile.py").write_text(SCRIPT)
    done = gateway_run(server, tmp_path, "hostile.py")
    assert done.returncode == 1
    assert_inert(done.stdout)
    assert_inert(done.stderr)
    assert "beforeafter" in done.stdout
    assert "err!" in done.stderr and "ValueError" in done.stderr
    assert "pwned" not in done.stdout  # the title's text went with its sequence


def test_raw_prints_the_output_as_it_came(server: GatewayThread, tmp_path: Path) -> None:
    (tmp_path / "hostile.py").write_text(SCRIPT)
    done = gateway_run(server, tmp_path, "hostile.py", "--raw")
    assert "before" + HOSTILE + "after" in done.stdout


def test_a_notebook_report_cannot_drive_the_terminal(server: GatewayThread, tmp_path: Path) -> None:
    cell = nbformat.v4.new_code_cell(f"raise ValueError({('bad' + HOSTILE)!r})")
    (tmp_path / "hostile.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook(cells=[cell])))
    done = gateway_run(server, tmp_path, "hostile.ipynb")
    assert done.returncode == 1
    assert_inert(done.stdout)
    assert_inert(done.stderr)
    assert "first error at In [1]: ValueError: bad" in done.stdout


@pytest.mark.parametrize(
    ("text", "safe"),
    [
        ("plain text\twith\ttabs\r\n", "plain text\twith\ttabs\r\n"),
        ("\x1b[31mred\x1b[0m", "red"),
        ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),
        ("unterminated \x1b]0;title", "unterminated "),
        ("lone escape \x1b", "lone escape "),
        ("\u00e9t\u00e9 \u2603", "\u00e9t\u00e9 \u2603"),  # non-ASCII text stays
    ],
)
def test_terminal_safe(text: str, safe: str) -> None:
    assert terminal_safe(text) == safe
    assert_inert(terminal_safe(text))


def test_strip_colors_keeps_everything_but_colors() -> None:
    assert strip_colors("\x1b[0;31mValueError\x1b[0m: x\x07") == "ValueError: x\x07"
