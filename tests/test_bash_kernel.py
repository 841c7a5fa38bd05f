"""The bash kernel (kernels/bash) as a real subprocess, driven over ipc with jupyter_client."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from jupyter_client.blocking import BlockingKernelClient

from gateway.sandbox.kernelspec import kernel_argv

REPO = Path(__file__).resolve().parent.parent
MAX_TEXT = 64 * 1024

Message = dict[str, Any]


@dataclass
class Kernel:
    proc: subprocess.Popen[bytes]
    client: BlockingKernelClient
    tmp: Path  # short folder: connection file and ipc sockets
    kernel_tmp: Path  # the kernel's TMPDIR
    launched: float  # time.monotonic() at launch


@dataclass
class Result:
    reply: Message
    iopub: list[tuple[float, Message]]  # (arrival time, message), busy .. idle
    sent: float

    def stream(self, name: str) -> str:
        return "".join(
            m["content"]["text"]
            for _, m in self.iopub
            if m["msg_type"] == "stream" and m["content"]["name"] == name
        )

    def types(self) -> list[str]:
        return [m["msg_type"] for _, m in self.iopub]


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) for every process we can see."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def descendants(pid: int) -> set[int]:
    table = process_table()
    found: set[int] = set()
    stack = [pid]
    while stack:
        parent = stack.pop()
        for child, (ppid, _) in table.items():
            if ppid == parent and child not in found:
                found.add(child)
                stack.append(child)
    return found


def living(pids: set[int]) -> set[int]:
    table = process_table()
    return {pid for pid in pids if pid in table and table[pid][1] != "Z"}


@contextlib.contextmanager
def bash_kernel(wait: bool = True) -> Iterator[Kernel]:
    """A kernel subprocess and a connected client; with `wait`, iopub is known to be live."""
    tmp = Path(tempfile.mkdtemp(prefix="bk", dir="/tmp"))  # ipc paths must stay short
    proc: subprocess.Popen[bytes] | None = None
    client: BlockingKernelClient | None = None
    context = zmq.Context()
    context.setsockopt(zmq.RECONNECT_IVL, 10)  # connect soon after the kernel binds
    try:
        kernel_tmp = tmp / "t"
        kernel_tmp.mkdir()
        connection_file = tmp / "k.json"
        info = {
            "transport": "ipc",
            "ip": str(tmp / "k"),
            "shell_port": 1,
            "iopub_port": 2,
            "stdin_port": 3,
            "control_port": 4,
            "hb_port": 5,
            "key": secrets.token_hex(16),
            "signature_scheme": "hmac-sha256",
            "kernel_name": "bash",
        }
        connection_file.write_text(json.dumps(info))
        env = {**os.environ, "TMPDIR": str(kernel_tmp), "PYTHONPATH": str(REPO)}
        launched = time.monotonic()
        proc = subprocess.Popen(
            kernel_argv("bash", sys.executable, str(connection_file)),
            cwd=tmp,
            env=env,
        )
        client = BlockingKernelClient(connection_file=str(connection_file), context=context)
        client.load_connection_file()
        client.start_channels()
        if wait:
            wait_ready(client)
        yield Kernel(proc, client, tmp, kernel_tmp, launched)
    finally:
        if client is not None:
            client.stop_channels()
        context.destroy(linger=0)
        if proc is not None:
            for pid in descendants(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def until_output(kernel: Kernel, msg_id: str, text: str, timeout: float = 30) -> list[Any]:
    """Read the request's iopub messages until its stdout holds `text`; those messages."""
    deadline = time.monotonic() + timeout
    seen: list[tuple[float, Message]] = []
    while True:
        msg = kernel.client.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        seen.append((time.monotonic(), msg))
        printed = "".join(
            m["content"]["text"]
            for _, m in seen
            if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
        )
        if text in printed:
            return seen
        assert not (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle")


def wait_ready(client: BlockingKernelClient, timeout: float = 30) -> None:
    """One kernel_info request (queued until the kernel binds) and its reply, then a first
    iopub message (the kernel's welcome, or the request's status): the kernel answers and
    iopub is live. Unlike jupyter_client's wait_for_ready, no heartbeat deadline of its own,
    which a kernel still starting on a busy machine can miss."""
    msg_id = client.kernel_info()
    while client.get_shell_msg(timeout=timeout)["parent_header"].get("msg_id") != msg_id:
        pass
    client.get_iopub_msg(timeout=timeout)


def collect(
    kernel: Kernel, msg_id: str, sent: float, timeout: float = 30, prior: list[Any] | None = None
) -> Result:
    """The iopub messages of one request, up to its idle, then its shell reply (`prior`: the
    messages of the request read already)."""
    client = kernel.client
    deadline = time.monotonic() + timeout
    iopub: list[tuple[float, Message]] = list(prior or [])
    while True:
        msg = client.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        iopub.append((time.monotonic(), msg))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    while True:
        reply = client.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return Result(reply, iopub, sent)


def execute(kernel: Kernel, code: str, timeout: float = 30, **kwargs: Any) -> Result:
    sent = time.monotonic()
    msg_id = kernel.client.execute(code, **kwargs)
    return collect(kernel, msg_id, sent, timeout)


def control(kernel: Kernel, msg_type: str, content: Message | None = None) -> Message:
    client = kernel.client
    msg = client.session.msg(msg_type, content or {})
    client.control_channel.send(msg)
    while True:
        reply: Message = client.get_control_msg(timeout=10)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply


def test_kernel_info_and_startup_time() -> None:
    with bash_kernel(wait=False) as kernel:
        msg_id = kernel.client.kernel_info()
        reply = kernel.client.get_shell_msg(timeout=10)
        elapsed = time.monotonic() - kernel.launched
        print(f"bash kernel: launch to kernel_info_reply {elapsed * 1000:.0f} ms")
        assert reply["parent_header"]["msg_id"] == msg_id
        content = reply["content"]
        assert content["status"] == "ok"
        assert content["protocol_version"] == "5.3"
        assert content["implementation"] == "gateway-bash"
        info = content["language_info"]
        assert info["name"] == "bash"
        assert info["mimetype"] == "text/x-sh"
        assert info["file_extension"] == ".sh"
        assert info["version"][0].isdigit()
        assert content["banner"]
        # control answers too
        assert control(kernel, "kernel_info_request")["content"]["implementation"] == "gateway-bash"


def test_stdout_and_stderr_are_separate_streams() -> None:
    with bash_kernel() as kernel:
        result = execute(kernel, "echo out; echo err >&2; echo out2")
        assert result.stream("stdout") == "out\nout2\n"
        assert result.stream("stderr") == "err\n"
        content = result.reply["content"]
        assert content["status"] == "ok"
        assert content["exit_code"] == 0
        assert content["execution_count"] == 1
        assert result.reply["metadata"]["exit_code"] == 0
        types = result.types()
        assert types[0] == "status" and result.iopub[0][1]["content"]["execution_state"] == "busy"
        assert types[1] == "execute_input"
        assert result.iopub[1][1]["content"] == {
            "code": "echo out; echo err >&2; echo out2",
            "execution_count": 1,
        }


def failed_alone(code: str, exit_code: int) -> Result:
    """`code` run by a bash kernel of its own: its reply is an error of `exit_code`."""
    with bash_kernel() as kernel:
        result = execute(kernel, code)
    content = result.reply["content"]
    assert content["status"] == "error"
    assert content["exit_code"] == exit_code
    return result


def test_exit_reports_its_code_and_earlier_output() -> None:
    result = failed_alone("echo before; echo warn >&2; exit 3; echo never", 3)
    content = result.reply["content"]
    assert content["ename"] == "ExitStatus"
    assert content["evalue"] == "3"
    assert result.reply["metadata"]["exit_code"] == 3
    assert result.stream("stdout") == "before\n"
    assert result.stream("stderr") == "warn\n"
    assert "error" not in result.types()


def test_false_is_an_error_reply_without_error_message() -> None:
    result = failed_alone("false", 1)
    assert result.reply["content"]["traceback"] == []
    assert "error" not in result.types()
    assert result.stream("stdout") == result.stream("stderr") == ""


def test_state_persists_between_cells() -> None:
    with bash_kernel() as kernel:
        first = execute(kernel, 'x=42; f() { echo "f:$1"; }; cd /; export E=exported')
        assert first.reply["content"]["status"] == "ok"
        result = execute(kernel, "echo $x; f 1; pwd; bash -c 'echo $E'")
        assert result.stream("stdout") == "42\nf:1\n/\nexported\n"
        assert result.reply["content"]["execution_count"] == 2


def test_fresh_shell_after_exit() -> None:
    with bash_kernel() as kernel:
        execute(kernel, "x=1")
        assert execute(kernel, "exit 3").reply["content"]["exit_code"] == 3
        result = execute(kernel, 'echo "x=${x:-unset}"')
        assert result.reply["content"]["status"] == "ok"
        assert result.stream("stdout") == "x=unset\n"
        assert result.reply["content"]["execution_count"] == 3


def test_output_streams_while_the_cell_runs() -> None:
    """`a` arrives while the cell still runs: the cell waits for a file that the test makes
    only once `a` is here (no clock involved)."""
    with bash_kernel() as kernel:
        go = kernel.tmp / "go"
        sent = time.monotonic()
        msg_id = kernel.client.execute(f"echo a; while [ ! -e {go} ]; do sleep 0.05; done; echo b")
        prior = until_output(kernel, msg_id, "a\n")
        assert [m["msg_type"] for _, m in prior][-1] == "stream"  # not idle: still running
        go.touch()
        result = collect(kernel, msg_id, sent, prior=prior)
        arrivals = [m["content"]["text"] for _, m in result.iopub if m["msg_type"] == "stream"]
        assert "".join(arrivals) == "a\nb\n" and arrivals[0] == "a\n"
        assert result.reply["content"]["status"] == "ok"


def test_output_without_trailing_newline_is_exact() -> None:
    with bash_kernel() as kernel:
        result = execute(kernel, "printf abc; printf xyz >&2")
        assert result.stream("stdout") == "abc"
        assert result.stream("stderr") == "xyz"
        again = execute(kernel, "printf 'd\\ne'")
        assert again.stream("stdout") == "d\ne"


def test_stdin_is_dev_null() -> None:
    with bash_kernel() as kernel:
        result = execute(kernel, 'cat; read line; echo "read=$?"', timeout=10)
        assert result.stream("stdout") == "read=1\n"
        assert result.reply["content"]["status"] == "ok"


def test_background_job_does_not_hold_the_reply() -> None:
    with bash_kernel() as kernel:
        # a reply held by the job would come after 100 s: the 30 s collect would fail first
        result = execute(kernel, "sleep 100 & echo started", timeout=30)
        assert result.stream("stdout") == "started\n"


def test_interrupt_request_ends_the_cell_and_keeps_state() -> None:
    with bash_kernel() as kernel:
        execute(kernel, "x=kept")
        sent = time.monotonic()
        msg_id = kernel.client.execute("echo go; sleep 100; echo after")
        prior = until_output(kernel, msg_id, "go\n")
        assert control(kernel, "interrupt_request")["content"]["status"] == "ok"
        result = collect(kernel, msg_id, sent, timeout=30, prior=prior)  # sleep 100 otherwise
        assert result.reply["content"]["exit_code"] == 130
        assert result.stream("stdout") == "go\n"
        assert execute(kernel, "echo $x").stream("stdout") == "kept\n"


def test_interrupt_leaves_functions_and_loops() -> None:
    with bash_kernel() as kernel:
        sent = time.monotonic()
        code = "f() { echo in-f; while :; do sleep 1; done; echo f-after; }\nf\necho cell-after"
        msg_id = kernel.client.execute(code)
        prior = until_output(kernel, msg_id, "in-f\n")
        control(kernel, "interrupt_request")
        result = collect(kernel, msg_id, sent, timeout=30, prior=prior)
        assert result.reply["content"]["exit_code"] == 130
        assert result.stream("stdout") == "in-f\n"
        # a busy builtin loop after that is interruptible too
        sent = time.monotonic()
        msg_id = kernel.client.execute("echo spinning; while :; do :; done")
        prior = until_output(kernel, msg_id, "spinning\n")
        control(kernel, "interrupt_request")
        result = collect(kernel, msg_id, sent, timeout=30, prior=prior)
        assert result.reply["content"]["exit_code"] == 130
        assert execute(kernel, "echo ok").stream("stdout") == "ok\n"


def test_sigint_to_the_kernel_interrupts_the_cell() -> None:
    with bash_kernel() as kernel:
        sent = time.monotonic()
        msg_id = kernel.client.execute("echo sleeping; sleep 100")
        prior = until_output(kernel, msg_id, "sleeping\n")
        kernel.proc.send_signal(signal.SIGINT)
        result = collect(kernel, msg_id, sent, timeout=30, prior=prior)
        assert result.reply["content"]["exit_code"] == 130
        assert kernel.proc.poll() is None
        assert execute(kernel, "echo alive").stream("stdout") == "alive\n"


def test_killed_by_signal_reports_128_plus_signal() -> None:
    with bash_kernel() as kernel:
        assert (
            execute(kernel, "sleep 100 & kill -9 $!; wait $!").reply["content"]["exit_code"] == 137
        )
        assert execute(kernel, "kill -TERM $$").reply["content"]["exit_code"] == 143
        assert execute(kernel, "echo next").stream("stdout") == "next\n"


def _start_background_and_record(kernel: Kernel) -> set[int]:
    result = execute(kernel, "sleep 100 & echo $$ $!")
    bash_pid, job_pid = (int(p) for p in result.stream("stdout").split())
    pids = descendants(kernel.proc.pid)
    assert {bash_pid, job_pid} <= pids
    assert any(p.name.startswith("bash-kernel-") for p in kernel.kernel_tmp.iterdir())
    return pids


def test_shutdown_request_leaves_nothing_behind() -> None:
    with bash_kernel() as kernel:
        pids = _start_background_and_record(kernel)
        reply = control(kernel, "shutdown_request", {"restart": False})
        assert reply["content"]["status"] == "ok"
        assert kernel.proc.wait(10) == 0
        assert living(pids) == set()
        assert list(kernel.kernel_tmp.iterdir()) == []


def test_sigterm_leaves_nothing_behind() -> None:
    with bash_kernel() as kernel:
        pids = _start_background_and_record(kernel)
        kernel.proc.terminate()
        assert kernel.proc.wait(10) == 0
        assert living(pids) == set()
        assert list(kernel.kernel_tmp.iterdir()) == []


def test_large_output_arrives_complete_in_bounded_messages() -> None:
    size = 5_000_000
    with bash_kernel() as kernel:
        result = execute(kernel, f"head -c {size} /dev/zero | tr '\\0' x", timeout=60)
        texts = [
            m["content"]["text"]
            for _, m in result.iopub
            if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"
        ]
        assert sum(len(t) for t in texts) == size
        assert set("".join(texts)) == {"x"}
        assert max(len(t.encode()) for t in texts) <= MAX_TEXT
        assert result.reply["content"]["exit_code"] == 0


def test_silent_cells_do_not_count() -> None:
    with bash_kernel() as kernel:
        result = execute(kernel, "echo quiet", silent=True)
        assert "execute_input" not in result.types()
        assert result.stream("stdout") == "quiet\n"
        assert execute(kernel, "true").reply["content"]["execution_count"] == 1


def test_xtrace_shows_only_the_cell() -> None:
    # bash prefixes traces from a sourced file with PS4 twice ("++ "): cells are sourced
    with bash_kernel() as kernel:
        execute(kernel, "set -x")
        result = execute(kernel, "echo two")
        assert result.stream("stdout") == "two\n"
        assert result.stream("stderr") == "++ echo two\n"
        assert execute(kernel, "set +x; echo three").stream("stderr") == "++ set +x\n"
        assert execute(kernel, "echo four").stream("stderr") == ""


def test_other_shell_requests() -> None:
    with bash_kernel() as kernel:
        client = kernel.client
        client.is_complete("echo a \\")
        assert client.get_shell_msg(timeout=10)["content"]["status"] == "incomplete"
        client.is_complete("echo a")
        assert client.get_shell_msg(timeout=10)["content"]["status"] == "complete"
        client.complete("ec", 2)
        assert client.get_shell_msg(timeout=10)["content"]["matches"] == []
        client.inspect("echo", 2)
        assert client.get_shell_msg(timeout=10)["content"]["found"] is False
        client.history()
        assert client.get_shell_msg(timeout=10)["content"]["history"] == []
        client.comm_info()
        assert client.get_shell_msg(timeout=10)["content"]["comms"] == {}


def test_iopub_welcome_greets_a_new_subscriber() -> None:
    with bash_kernel(wait=False) as kernel:
        deadline = time.monotonic() + 10
        types = []
        while "iopub_welcome" not in types and time.monotonic() < deadline:
            types.append(kernel.client.get_iopub_msg(timeout=10)["msg_type"])
        assert "iopub_welcome" in types
