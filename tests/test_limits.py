"""Output caps are applied as output arrives; floods cannot grow the gateway's memory."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest

from tests.conftest import start_gateway
from tests.support import GatewayThread

CAP = 10_000


@pytest.fixture
def capped(backend_name: str) -> Iterator[GatewayThread]:
    server = start_gateway(backend_name, stream_cap_bytes=CAP, output_limit_bytes=8 * 1024 * 1024)
    try:
        yield server
    finally:
        server.stop()


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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


def test_flood_does_not_grow_gateway_memory(capped: GatewayThread) -> None:
    before = peak_rss()
    code = (
        "import sys\nchunk = 'y' * 999 + '\\n'\nfor _ in range(6000):\n    sys.stdout.write(chunk)"
    )
    record = capped.client().run(code=code)  # 6 MB of output, under the 8 MB kill limit
    assert record["status"] == "succeeded" and record["stdout_truncated"]
    grown = peak_rss() - before
    assert grown < 24 * 1024 * 1024, f"the gateway grew by {grown} bytes"


def test_endless_output_is_killed_at_the_output_limit(capped: GatewayThread) -> None:
    before = peak_rss()
    code = "import sys\nwhile True:\n    sys.stdout.write('z' * 65536)"
    record = capped.client().run(code=code, timeout=60)
    assert record["status"] == "killed" and record["kill_reason"] == "output_limit"
    assert record["exit_code"] is None and record["stdout_truncated"]
    assert peak_rss() - before < 48 * 1024 * 1024


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
