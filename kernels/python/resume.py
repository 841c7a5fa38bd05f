"""ipykernel as a snapshot (`kernels.snapshot`, DESIGN decision 24): `keep()` and `stop()`,
which the gateway runs silently after a run with `keep`, and `restart`, which starts
ipykernel again in a continuation around the snapshot's shell."""

from __future__ import annotations

import asyncio
from typing import Any

from kernels import snapshot

# what `IPKernelApp.initialize` makes and refuses to find made already
APP_OWN = (
    "context",
    "heartbeat",
    "iopub_thread",
    "control_thread",
    "shell_channel_thread",
    "kernel",
)


def keep() -> None:
    """This kernel is to become a snapshot once its loop stops (`stop`)."""
    snapshot.keep()


def stop() -> None:
    """Stop the kernel's loop: `prebuilt.launch` (or `restart`) then freezes it. The
    gateway asks it after `keep`'s reply, and waits for no reply of its own."""
    from IPython import get_ipython

    loop = get_ipython().kernel.io_loop
    loop.add_callback(loop.stop)


def _forget_zmq_contexts() -> None:
    """pyzmq tells a fork by its pid, and a continuation's is the snapshot's kernel's (pid 2
    of a PID namespace of its own): without this its shared context and the garbage
    collector of zero-copy sends (a large PNG) would be the snapshot's, whose descriptors
    are /dev/null here, and the first large send would abort the kernel."""
    import zmq
    from zmq.utils import garbage

    # the collector's next use starts it again, with a context of its own, as after a fork
    # it can tell (pyzmq's own cache of the collector keeps this object)
    garbage.gc.pid = None
    zmq.Context._instance = None
    zmq.Context._instance_pid = None


def restart(argv: list[str]) -> None:
    """Start ipykernel again in this process around the snapshot's shell; serve until it
    ends, then freeze if it was kept in its turn (a snapshot of a continuation)."""
    import sys

    from ipykernel import ipkernel, kernelapp
    from ipykernel.zmqshell import ZMQInteractiveShell
    from jupyter_client.session import Session

    import kernels.python.startup as startup
    from kernels.python import prebuilt

    sys.argv = ["ipykernel", *argv]
    _forget_zmq_contexts()
    app: Any = kernelapp.IPKernelApp.instance()
    shell: Any = ZMQInteractiveShell.instance()
    app.reset_io()
    # the snapshot's kernel object and comm manager are singletons: the new ones are new
    ipkernel.IPythonKernel.clear_instance()
    ipkernel._comm_manager = None
    for name in APP_OWN:
        setattr(app, name, None)
    # a session of its own: the snapshot's drops what it is asked to send from a fork
    # (`Session.check_pid`), and its id is the snapshot's
    app.session = Session(parent=app)
    if "-f" in argv:  # its own connection file (the same path, in its own sandbox, so far)
        app.connection_file = argv[argv.index("-f") + 1]
    asyncio.set_event_loop(asyncio.new_event_loop())
    snapshot.listen(restart)  # in its own socket folder, before the gateway takes the folder
    prebuilt.initialize_again(app, shell, argv)
    startup.attach_kernel(shell)
    app.start()
    if snapshot.kept():
        snapshot.freeze()
