"""A forked Python kernel is built in its warm parent (DESIGN.md decision 23,
`kernels/python/prebuilt.py`): the application, the shell and its formatters exist before
the fork, and each child makes only its own sockets, threads and kernel object. Three
promises: each child starts from the built, empty state whatever an earlier one did; the
built kernel is the kernel a normal start makes (compared with a Docker kernel of the same
image, which starts the usual way); and a kernel whose environment is not the one the
parent built with starts the usual way, and works.

What each child shares with no other (descriptors, random state, key, namespaces) is
tested in test_attacks_forkserver.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.execution.session import start_session
from gateway.sandbox.base import SandboxSpec
from tests.conftest import start_gateway
from tests.support import GatewayThread, serving


@pytest.fixture(scope="module")
def forked() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("forkserver"))


# Everything a run can leave in its kernel's process: globals, an execute result (Out), an
# import, a module the parent imported changed, an open figure, a changed figure format, the environment,
# sys.path, the shell's hidden names, the random state.
DIRTY = """\
import os, random, sys
before = 'tabnanny' in sys.modules
import tabnanny
import matplotlib
matplotlib.patched = True
import matplotlib.pyplot as plt
plt.figure()
get_ipython().run_line_magic('config', 'InlineBackend.figure_formats = ["svg"]')
os.environ['LEAKED'] = '1'
sys.path.append('/leaked')
get_ipython().user_ns_hidden['hidden_leak'] = 1
random.seed(0)
x = 41
result = {'before': before, 'count': get_ipython().execution_count}
x
"""

CLEAN = """\
import os, sys
import matplotlib, matplotlib.pyplot as plt
from matplotlib_inline.backend_inline import InlineBackend
ip = get_ipython()
result = {
    'x': 'x' in ip.user_ns,
    'tabnanny': 'tabnanny' in sys.modules,
    'patched': hasattr(matplotlib, 'patched'),
    'figures': plt.get_fignums(),
    'formats': sorted(InlineBackend.instance().figure_formats),
    'leaked': 'LEAKED' in os.environ or '/leaked' in sys.path,
    'hidden': 'hidden_leak' in ip.user_ns_hidden,
    'out': dict(ip.user_ns['Out']),
    'count': ip.execution_count,
    'built': type(ip.parent).__name__,
}
"""


def test_each_forked_kernel_starts_from_the_built_empty_state(forked: GatewayThread) -> None:
    client = forked.client()
    dirty = client.run(code=DIRTY)
    assert dirty["status"] == "succeeded", dirty
    assert dirty["result"]["before"] is False, dirty["result"]
    first = dirty["result"]["count"]  # a fresh kernel's first run's
    for _ in range(2):  # the one after, and the one after that
        clean = client.run(code=CLEAN)
        assert clean["status"] == "succeeded", clean
        assert clean["result"] == {
            "x": False,
            "tabnanny": False,
            "patched": False,
            "figures": [],
            "formats": ["png"],
            "leaked": False,
            "hidden": False,
            "out": {},
            "count": first,
            # the shell was built before the kernel, by the application: the warm parent's
            # (a kernel started the usual way makes its shell itself, as its child)
            "built": "IPKernelApp",
        }


# What a kernel's start makes of its shell: the same, built in a warm parent or not.
SHELL = """\
import os, sys
import matplotlib, matplotlib.pyplot
from IPython.core.application import BaseIPythonApplication
from matplotlib_inline.backend_inline import InlineBackend
ip = get_ipython()
png = ip.display_formatter.formatters['image/png'].type_printers
result = {
    'shell': type(ip).__name__,
    'kernel': type(ip.kernel).__name__,
    'compiler': type(ip.compile).__name__,
    'history': ip.history_manager.enabled,
    'cwd': os.getcwd(),
    'dh': [str(p) for p in ip.user_ns['_dh']],
    'starting_dir': ip.starting_dir,
    'path0': sys.path[0],
    'profile': ip.profile_dir.location,
    'profile_dirs': sorted(os.listdir(ip.profile_dir.location)),
    'env': {k: os.environ.get(k) for k in (
        'TERM', 'CLICOLOR', 'FORCE_COLOR', 'PAGER', 'GIT_PAGER', 'MPLBACKEND', 'HOME',
        'IPYTHONDIR',
    )},
    'user_ns': sorted(ip.user_ns),
    'hidden': sorted(ip.user_ns_hidden),
    'formats': sorted(InlineBackend.instance().figure_formats),
    'png_figures': sorted(t.__name__ for t in png),
    'post_execute': [getattr(f, '__name__', '?') for f in ip.events.callbacks['post_execute']],
    'extensions': sorted(ip.extension_manager.loaded),
    'interactive': matplotlib.is_interactive(),
    'backend': matplotlib.get_backend(),
    'hooks': [type(sys.displayhook).__name__, type(sys.stdout).__name__,
              type(sys.stderr).__name__],
    'count': ip.execution_count,
    # an IPython application the user makes parses its own command line and config
    'base_initialize': BaseIPythonApplication.initialize.__name__,
}
"""


def test_a_built_kernel_is_the_kernel_a_normal_start_makes(forked: GatewayThread) -> None:
    docker = start_gateway("docker")
    try:
        usual = docker.client().run(code=SHELL)
    finally:
        docker.stop()
    built = forked.client().run(code=SHELL)
    assert usual["status"] == built["status"] == "succeeded", (usual, built)
    assert built["result"] == usual["result"]
    assert usual["result"]["png_figures"] == ["Figure"]  # charts come back as PNG
    assert usual["result"]["env"]["TERM"] == "xterm-color"  # what ipykernel's shell sets


async def _facts(server: GatewayThread, env: dict[str, str]) -> dict[str, Any]:
    """Start a kernel with `env` straight from the backend and ask it what it is."""
    services = server.gateway.services
    assert services is not None
    pools = services.runs.pools
    spec = SandboxSpec(run_id="own-env", language="python", limits=pools.config.limits(), env=env)
    session = await start_session(pools.backend, spec, pools.config, pools.wire, asyncio.Event())
    try:
        asked = {
            "env": "__import__('os').environ.get('OWN')",
            "built": "type(get_ipython().parent).__name__",
            "charts": "sorted(t.__name__ for t in get_ipython().display_formatter"
            ".formatters['image/png'].type_printers)",
            "ours": "sorted(get_ipython().extension_manager.loaded)",
        }
        reply = await session.client.run_silent("pass", 60, asked)
        return {k: v["data"]["text/plain"] for k, v in reply["user_expressions"].items()}
    finally:
        await session.close()


def test_a_kernel_with_an_environment_of_its_own_starts_the_usual_way(
    forked: GatewayThread,
) -> None:
    facts = forked.call(_facts(forked, {"OWN": "mine"}))
    assert facts == {
        "env": "'mine'",
        "built": "'IPythonKernel'",  # its shell made by its kernel, not the parent's
        "charts": "['Figure']",  # matplotlib's inline hooks installed on its own shell
        "ours": "['IPython.extensions.storemagic', 'kernels.python.startup']",
    }
    assert forked.call(_facts(forked, {}))["built"] == "'IPKernelApp'"
