"""`gateway run` watching a run live, with `--files` and `--return`: a notebook that reads
`data/x.csv` (staged with `--files data/`) and writes `out.csv` (saved with `--return`),
on a terminal (a pty: tqdm's line redrawn in place), on a terminal that reports a size of
0x0 and not on a terminal (plain lines); a script the same way; a folder over the
gateway's limits is refused saying so."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from gateway.commands.progress import CellProgress, TerminalProgress, cell_progress
from tests.conftest import start_gateway
from tests.support import GatewayThread, serving

FILES_BYTES = 64 * 1024  # the gateway's max_files_bytes here


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("local", max_files_bytes=FILES_BYTES))


def command(server: GatewayThread, *args: str) -> list[str]:
    url = f"http://127.0.0.1:{server.port}"
    return [sys.executable, "-m", "gateway", "run", *args, "--url", url]


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}


def gateway_run(
    server: GatewayThread, folder: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """`gateway run ARGS` in `folder`, not on a terminal, to its end."""
    return subprocess.run(
        command(server, *args),
        cwd=folder,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def project(folder: Path) -> Path:
    """A notebook beside its data folder: it reads data/x.csv and writes out.csv."""
    (folder / "data" / "more").mkdir(parents=True)
    (folder / "data" / "x.csv").write_text("a,b\n1,2\n3,4\n")
    (folder / "data" / "more" / "blob.bin").write_bytes(bytes(range(256)))
    cells = [
        nbformat.v4.new_markdown_cell("# Sums"),
        nbformat.v4.new_code_cell("import csv\nrows = list(csv.DictReader(open('data/x.csv')))"),
        nbformat.v4.new_code_cell(
            "total = sum(int(r['a']) + int(r['b']) for r in rows)\n"
            "size = len(open('data/more/blob.bin', 'rb').read())\n"
            "open('out.csv', 'w').write(f'total,size\\n{total},{size}\\n')\nprint(total)"
        ),
    ]
    path = folder / "sums.ipynb"
    path.write_text(nbformat.writes(nbformat.v4.new_notebook(cells=cells)))
    return path


def test_a_notebook_with_its_data_folder_and_a_returned_file(
    server: GatewayThread, tmp_path: Path
) -> None:
    project(tmp_path)
    done = gateway_run(server, tmp_path, "sums.ipynb", "--files", "data/", "--return", "out.csv")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(" · ")[0] for line in lines[:2]] == ["[1/2] In [1]", "[2/2] In [2]"]
    assert all(re.search(r" · (\d+ ms|\d+\.\d s)$", line) for line in lines[:2])  # plain lines
    assert "\r" not in done.stdout and "\x1b" not in done.stdout
    assert lines[2].startswith("sums.ipynb: succeeded in ")
    assert "saved out.csv" in lines
    assert (tmp_path / "out.csv").read_text() == "total,size\n10,256\n"
    executed = nbformat.read(tmp_path / "sums.executed.ipynb", as_version=4)
    assert executed.cells[2].outputs[0]["text"] == "10\n"


def read_all(fd: int, timeout: float = 120) -> bytes:
    """Everything written to the pty until the child closed it."""
    data = b""
    while True:
        ready, _, _ = select.select([fd], [], [], timeout)
        assert ready, f"no output in {timeout} s: {data!r}"
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child's side is closed
            return data
        if not chunk:
            return data
        data += chunk


def test_on_a_terminal_the_progress_line_is_redrawn_and_the_error_shown_at_once(
    server: GatewayThread, tmp_path: Path
) -> None:
    path = project(tmp_path)
    nb = json.loads(path.read_text())
    nb["cells"].append(nbformat.v4.new_code_cell("raise ValueError('bad \\x1b]0;pwned\\x07x')"))
    (tmp_path / "fails.ipynb").write_text(json.dumps(nb))
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    child = subprocess.Popen(
        command(server, "fails.ipynb", "--files", "data", "--return", "out.csv", "*.txt"),
        cwd=tmp_path,
        env={**environment(), "TERM": "xterm"},
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    try:
        screen = read_all(primary).decode()
    finally:
        os.close(primary)
        child.wait(timeout=60)
    assert child.returncode == 1, screen
    # tqdm redraws its line in place (a plain line ends "\r\n" on a pty: ONLCR)
    assert "[3/3] In [3]" in screen and "\r[" in screen
    assert "error at In [3]:" in screen and "ValueError" in screen
    assert screen.index("ValueError") < screen.index("fails.ipynb: failed in ")
    assert "\x1b]" not in screen and "\x07" not in screen  # the run's OSC did not reach it
    assert "ValueError: bad x" in screen
    assert "saved out.csv" in screen and "*.txt: not returned (no file matches)" in screen
    assert (tmp_path / "out.csv").read_text() == "total,size\n10,256\n"


def on_a_terminal(rows: int, columns: int) -> tuple[int, int]:
    """A pseudo-terminal (primary, secondary) that reports this size."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    return primary, secondary


@pytest.mark.fast
@pytest.mark.parametrize(
    ("rows", "columns", "display"),
    [
        (24, 100, TerminalProgress),
        (0, 0, CellProgress),
        (0, 80, CellProgress),
        (24, 0, CellProgress),
    ],
)
def test_only_a_terminal_that_reports_its_size_gets_the_redrawn_line(
    rows: int, columns: int, display: type[CellProgress]
) -> None:
    """tqdm draws nothing on a terminal of 0 rows (`script`, `docker exec -t` and some CI
    runners report 0x0): there, as off a terminal, each cell is a plain line."""
    primary, secondary = on_a_terminal(rows, columns)
    with os.fdopen(secondary, "w", encoding="utf-8") as out:
        shown = cell_progress(3, out)
        try:
            assert type(shown) is display
        finally:
            shown.close()
    os.close(primary)


def test_on_a_terminal_that_reports_0x0_each_cell_is_a_plain_line(
    server: GatewayThread, tmp_path: Path
) -> None:
    project(tmp_path)
    primary, secondary = on_a_terminal(0, 0)
    child = subprocess.Popen(
        command(server, "sums.ipynb", "--files", "data"),
        cwd=tmp_path,
        env={k: v for k, v in environment().items() if k not in ("COLUMNS", "LINES")},
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    try:
        screen = read_all(primary).decode()
    finally:
        os.close(primary)
        child.wait(timeout=60)
    assert child.returncode == 0, screen
    lines = screen.split("\r\n")  # a pty ends a line with \r\n (ONLCR)
    assert re.fullmatch(r"\[1/2\] In \[1\] · (\d+ ms|\d+\.\d s)", lines[0]), screen
    assert re.fullmatch(r"\[2/2\] In \[2\] · (\d+ ms|\d+\.\d s)", lines[1]), screen
    assert lines[2].startswith("sums.ipynb: succeeded in ")
    assert "\x1b" not in screen and "\r[" not in screen  # nothing redrawn


def test_a_script_with_files_and_a_returned_file(server: GatewayThread, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "n.txt").write_text("21\n")
    (tmp_path / "job.sh").write_text(
        "echo start\nn=$(cat in/n.txt)\nmkdir -p res\necho $((n * 2)) > res/answer.txt\n"
    )
    done = gateway_run(server, tmp_path, "job.sh", "--files", "in/n.txt", "--return", "res/*.txt")
    assert (done.returncode, done.stdout) == (0, "start\n"), done.stderr
    assert (tmp_path / "res" / "answer.txt").read_text() == "42\n"
    assert "saved res/answer.txt" in done.stderr


def test_a_folder_over_the_gateways_limits_is_refused_saying_what_it_held(
    server: GatewayThread, tmp_path: Path
) -> None:
    project(tmp_path)
    (tmp_path / "data" / "big.bin").write_bytes(os.urandom(FILES_BYTES))
    done = gateway_run(server, tmp_path, "sums.ipynb", "--files", "data/")
    assert done.returncode == 2, done.stderr
    assert "payload_too_large" in done.stderr
    assert "--files sent data/ (3 files, 64." in done.stderr, done.stderr
    missing = gateway_run(server, tmp_path, "sums.ipynb", "--files", "nowhere/")
    assert missing.returncode == 2 and "--files nowhere/: no such file" in missing.stderr
