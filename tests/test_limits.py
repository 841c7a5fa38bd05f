"""Output caps are applied as output arrives; floods cannot grow the gateway's memory (measured
on a gateway in its own process, by its current resident memory)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import start_gateway
from tests.support import GatewayProcess, GatewayThread, serving, watching

CAP = 10_000


@pytest.fixture
def capped(backend_name: str) -> Iterator[GatewayThread]:
    yield from serving(
        start_gateway(backend_name, stream_cap_bytes=CAP, output_limit_bytes=8 * 1024 * 1024)
    )


@pytest.fixture
def capped_process(backend_name: str, tmp_path: Path) -> Iterator[GatewayProcess]:
    """The same caps, on a gateway in a process of its own: its memory is its alone."""
    server = GatewayProcess(
        backend_name, tmp_path, stream_cap_bytes=CAP, output_limit_bytes=8 * 1024 * 1024
    )
    try:
        yield server.start()
    finally:
        server.stop()


def test_large_output_keeps_head_and_tail(capped: GatewayThread) -> None:
    code = "for i in range(200000):\n    print(f'line {i}')\nimport sys\nprint('the end', file=sys.stderr)"
    record = capped.client().run(code=code)
    assert record["status"] == "succeeded"
    assert record["stdout_truncated"] and record["output_truncated"]
    assert not record["stderr_truncated"] and record["stderr"] == "the end\n"
    stdout = record["stdout"]
    assert stdout.startswith("line 0\nline 1\n")
    assert stdout.rstrip().endswith("line 199999")
    assert "bytes truncated" in stdout
    assert len(stdout.encode()) < CAP + 200
    assert record["output"].endswith("the end\n")
    text = "".join(o.get("text", "") for o in record["outputs"] if o["output_type"] == "stream")
    assert len(text.encode()) < CAP + 200 and "bytes truncated" in text
    assert any("cut" in note for note in record["notes"])


def test_flood_does_not_grow_gateway_memory(capped_process: GatewayProcess) -> None:
    client = capped_process.client
    assert client.run(code="print('warm')")["status"] == "succeeded"  # imports, caches
    code = (
        "import sys\nchunk = 'y' * 999 + '\\n'\nfor _ in range(6000):\n    sys.stdout.write(chunk)"
    )
    with watching(capped_process.pid) as watch:
        record = client.run(code=code)  # 6 MB of output, under the 8 MB kill limit
    assert record["status"] == "succeeded" and record["stdout_truncated"]
    assert watch.growth < 16 * 1024 * 1024, watch.report()


def test_endless_output_is_killed_at_the_output_limit(capped_process: GatewayProcess) -> None:
    client = capped_process.client
    assert client.run(code="print('warm')")["status"] == "succeeded"
    code = "import sys\nwhile True:\n    sys.stdout.write('z' * 65536)"
    with watching(capped_process.pid) as watch:
        record = client.run(code=code, timeout=60)
    assert record["status"] == "killed" and record["kill_reason"] == "output_limit"
    assert record["exit_code"] is None and record["stdout_truncated"]
    assert watch.growth < 24 * 1024 * 1024, watch.report()


def test_endless_bash_output_ends_at_the_deadline_with_bounded_output(
    capped: GatewayThread,
) -> None:
    record = capped.client().run(
        language="bash", code="yes | head -c 5000000; sleep 100", timeout=3
    )
    assert record["status"] == "timed_out"
    assert record["stdout_truncated"] and len(record["stdout"]) < CAP + 200


def test_a_display_update_loop_counts_toward_the_output_limit(capped: GatewayThread) -> None:
    code = (
        "from IPython.display import display, HTML\n"
        "h = display(HTML('start'), display_id=True)\n"
        "while True:\n"
        "    h.update(HTML('x' * 100_000))\n"
    )
    record = capped.client().run(code=code, timeout=60)
    assert record["status"] == "killed" and record["kill_reason"] == "output_limit"
