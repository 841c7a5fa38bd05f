"""The warm pool (issue 10): never-used kernels started ahead, each taken by exactly one run
and destroyed after it; nothing of one run reaches another; a pooled kernel looks to the
code exactly like a cold one; a pool survives kernels that die while they wait; pools of
size 0 give the cold path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.execution.config import ExecutionConfig
from gateway.execution.pool import overcommitted, total_memory
from gateway.settings import GiB
from tests import census
from tests.api import full, pools, take
from tests.conftest import start_gateway
from tests.support import GatewayThread, part_config, wait_for


@pytest.fixture
def pooled(backend_name: str) -> Iterator[GatewayThread]:
    server = start_gateway(backend_name, pool_python=2, pool_bash=1)
    try:
        assert wait_for(lambda: full(server.client()), timeout=120), pools(server.client())
        yield server
    finally:
        server.stop()


IDENTITY = (
    "import os, sys, socket, tempfile\n"
    "open('/tmp/mark', 'w').write('x')\n"
    "import mymod\n"
    "os.environ['LEFT_BEHIND'] = '1'\n"
    "result = {'host': socket.gethostname(), 'pid': os.getpid(), 'ppid': os.getppid(),\n"
    "          'tmp': os.listdir('/tmp'), 'env': sorted(k for k in os.environ if k.startswith('LEFT')),\n"
    "          'mymod': 'mymod' in sys.modules, 'cwd': os.getcwd()}\n"
)
PROBE = (
    "import os, sys\n"
    "result = {'mark': os.path.exists('/tmp/mark'), 'env': 'LEFT_BEHIND' in os.environ,\n"
    "          'mymod': 'mymod' in sys.modules, 'files': sorted(os.listdir('.'))}\n"
)


def test_two_runs_never_share_a_sandbox_process_tmp_environment_or_module(
    pooled: GatewayThread,
) -> None:
    client = pooled.client()
    files = [{"path": "mymod.py", "content": "VALUE = 1\n"}]
    first = take(client, IDENTITY, files=files)["result"]
    second = take(client, PROBE)["result"]
    assert second == {"mark": False, "env": False, "mymod": False, "files": []}, second
    third = take(client, IDENTITY, files=files)["result"]
    # another container (Docker: its own hostname) or sandbox folder (local)
    assert (first["host"], first["cwd"]) != (third["host"], third["cwd"])
    assert first["env"] == third["env"] == ["LEFT_BEHIND"]


def test_the_runs_env_and_vars_reach_the_kernel_only_when_it_is_taken(
    pooled: GatewayThread,
) -> None:
    client = pooled.client()
    code = (
        "import os, subprocess\n"
        "result = [os.environ.get('COLOUR'), colour, input['colour'],\n"
        "          subprocess.run(['sh', '-c', 'echo $COLOUR'], capture_output=True,\n"
        "                         text=True).stdout.strip()]\n"
    )
    record = take(client, code, env={"COLOUR": "blue"}, vars={"colour": "red"})
    assert record["result"] == ["blue", "red", "red", "blue"], record
    bash = take(
        client,
        'echo "$COLOUR/$shade"',
        language="bash",
        env={"COLOUR": "green"},
        vars={"shade": "dark"},
    )
    assert bash["stdout"] == "green/dark\n"
    assert take(client, "import os\nresult = os.environ.get('COLOUR')")["result"] is None


def test_a_pooled_kernel_looks_like_a_cold_one(backend_name: str) -> None:
    code = (
        "import sys\n"
        "result = {'names': sorted(n for n in dir() if not n.startswith('_') and n != 'sys'),\n"
        "          'count': get_ipython().execution_count,\n"
        "          'history': len(get_ipython().user_ns.get('In', [])),\n"
        "          'figures': __import__('matplotlib.pyplot').pyplot.get_fignums()}\n"
    )
    seen = []
    for sizes in ({"pool_python": 1}, {"pool_python": 0}):
        server = start_gateway(backend_name, **sizes)
        try:
            client = server.client()
            if sizes["pool_python"]:
                seen.append(take(client, code)["result"])
            else:
                seen.append(client.run(code=code)["result"])
        finally:
            server.stop()
    pooled, cold = seen
    assert pooled == cold, (pooled, cold)


def test_a_run_asking_for_less_memory_gets_it_from_a_pooled_kernel(
    pooled: GatewayThread,
) -> None:
    client = pooled.client()
    body = {"input": {}, "params": {"source": "x = bytearray(700 * 1024 * 1024)\nresult = 1"}}
    assert wait_for(lambda: full(client), timeout=120)
    response = client.request("POST", "/v1/tools/run_python", body)
    assert response.status == 200
    answer = response.json()
    assert answer["result"] is None and "memory" in answer["stderr"], answer


def test_the_pool_survives_kernels_that_die_while_they_wait(pooled: GatewayThread) -> None:
    client = pooled.client()
    backend = pooled.gateway.services.runs.pools  # type: ignore[union-attr]
    idle = list(backend.pools["ipykernel"].ready)
    assert len(idle) == 2
    for session in idle:  # the kernels die under their pool (as an OOM or a crash would)
        pooled.call(session.sandbox.kill())
    assert wait_for(lambda: all(s not in backend.pools["ipykernel"].ready for s in idle), 30)
    assert wait_for(lambda: full(client), timeout=120), pools(client)
    assert take(client, "print('alive')")["stdout"] == "alive\n"


def _pooled_connections(server: GatewayThread) -> list[dict[str, Any]]:
    """The connection info of the gateway's pooled kernels, found from the outside."""
    instance = server.settings.instance_id or ""
    places = census.folders_of(instance) + census.forked_roots(instance)
    return [info for info in map(census.connection_of, places) if info is not None]


def test_a_pooled_kernel_spoken_to_while_it_waits_still_answers_and_serves_a_run(
    pooled: GatewayThread,
) -> None:
    # Every request makes a kernel publish its status on iopub (busy, idle), and our kernels
    # wait for their reader rather than drop (XPUB_NODROP): unread, a waiting kernel would
    # stop answering once 1,000 messages queue. 600 requests to each: 1,200 messages.
    from jupyter_client import BlockingKernelClient

    sizes = {kind: pool["size"] for kind, pool in pools(pooled.client()).items()}
    connections = _pooled_connections(pooled)
    assert len(connections) == sum(sizes.values()) >= 3, (sizes, connections)
    for info in connections:
        kernel = BlockingKernelClient()
        kernel.load_connection_info(info)
        kernel.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
        try:
            for _ in range(600):
                msg_id = kernel.kernel_info()
                while kernel.get_shell_msg(timeout=10)["parent_header"].get("msg_id") != msg_id:
                    pass
        finally:
            kernel.stop_channels()
    client = pooled.client()
    assert take(client, "print('alive')")["stdout"] == "alive\n"
    assert take(client, "echo alive", language="bash")["stdout"] == "alive\n"


def test_pools_of_size_zero_start_every_kernel_for_its_run(backend_name: str) -> None:
    server = start_gateway(backend_name, pool_python=0, pool_bash=0, pool_deno=0)
    try:
        client = server.client()
        assert pools(client) == {}
        health = client.request("GET", "/v1/health").json()
        assert health["kernels"]["pooled"] == 0
        record = client.run(code="print(1)")
        assert record["stdout"] == "1\n"
        metrics = client.request("GET", "/metrics").body.decode()
        assert 'gateway_pool_hits_total{kind="ipykernel"}' not in metrics
    finally:
        server.stop()


def test_shutdown_destroys_the_idle_pooled_kernels(backend_name: str) -> None:
    server = start_gateway(backend_name, pool_python=2, pool_bash=1)
    client = server.client()
    assert wait_for(lambda: full(client), timeout=120)
    server.stop()  # the no_leaks census then proves nothing of the pools is left


def test_a_shutdown_while_the_pools_fill_leaves_nothing(backend_name: str) -> None:
    """Stopping while a pooled kernel is still starting or preloading: that kernel is
    destroyed and waited for before the backend shuts down (on Docker the two removals of its
    container raced, and its volumes were left behind)."""
    server = start_gateway(backend_name, pool_python=2, pool_bash=1, pool_deno=1)

    def starting() -> bool:
        pools: dict[str, Any] = server.client().request("GET", "/v1/health").json()["pools"]
        return any(pool["starting"] for pool in pools.values())

    assert wait_for(starting, timeout=30)
    server.stop()  # the no_leaks census then proves nothing was left


def test_metrics_count_hits_and_misses(pooled: GatewayThread) -> None:
    client = pooled.client()
    take(client, "print(1)")
    text = client.request("GET", "/metrics").body.decode()
    assert 'gateway_pool_hits_total{kind="ipykernel"} 1.0' in text, text
    assert "gateway_kernels_pooled " in text


def test_a_pooled_run_reports_the_cpu_of_its_code_not_of_its_kernels_preloads(
    pooled: GatewayThread,
) -> None:
    """`usage.cpu_ms` counts from when the run's code was sent: a pooled kernel's start and
    preloads (matplotlib, numpy, pandas: well over half a second of CPU on any machine) are
    not the run's, so a pooled `print(1)` reports what a cold one would."""
    usage = take(pooled.client(), "print(1)")["usage"]
    assert usage["cpu_ms"] is not None and usage["cpu_ms"] < 300, usage


def test_settings_that_let_runs_empty_the_pools_are_named_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 20: runs using their memory limits can push available memory under
    `pool_min_free_bytes` and empty the pools for everyone. That can only happen where the
    runs' limits and that reserve do not fit in the machine: the gateway says so at start
    (DESIGN.md decision 14 says why the pools still give way then)."""
    fits = part_config(
        ExecutionConfig, max_concurrent_runs=4, memory_bytes=GiB, pool_min_free_bytes=GiB
    )
    assert overcommitted(fits, total=5 * GiB) is None
    why = overcommitted(fits, total=5 * GiB - 1)
    assert why is not None and "4.0 GiB" in why and "pool_min_free_bytes" in why
    assert overcommitted(fits, total=None) is None  # no /proc/meminfo: nothing to say
    total = total_memory()
    assert total is not None
    server = start_gateway(
        "local", pool_python=0, pool_deno=0, pool_bash=1, memory_bytes=total // 2
    )
    try:
        warned = [r for r in caplog.records if "can be emptied by runs" in r.getMessage()]
        assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    finally:
        server.stop()
