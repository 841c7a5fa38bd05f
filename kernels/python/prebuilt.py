"""The Python kernel built once in the forkserver's warm parent, so that each forked child
makes only what must be its own (DESIGN decision 23).

The parent (`build`, before any fork) makes what every kernel would make alike from the
same command line and environment: the kernel application with its command line, config
and profile parsed (`BaseIPythonApplication.initialize`), and the shell with its display
formatters, magics, namespace, the shell's half of our startup extension
(`startup.prepare_shell`) and matplotlib's inline integration, in /workspace as a kernel's
own start would have it. No socket, thread, key, file or anything of a request: the parent
never reads one.

The child (`launch`, in the sandbox, as the sandbox user) runs ipykernel's own
`IPKernelApp.initialize` with its first half already done: it reads its connection file
(its own HMAC key), binds its sockets, starts the heartbeat, iopub and control threads,
replaces stdout and stderr, sets its signal handlers and makes the kernel object, which
takes the built shell as its shell. Its random generators were re-seeded before
(`zygote.reseed`), and its profile folders are made in its own /tmp.

A request whose command line or environment differs from the ones the parent built with
(a run's own `env`) gets a kernel started as it would be without one: the built
application and shell are dropped first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
from typing import Any

from ipykernel import kernelapp
from ipykernel.compiler import XCachingCompiler
from ipykernel.zmqshell import ZMQInteractiveShell
from IPython.core.application import BaseIPythonApplication

import kernels.python.startup as startup
from kernels import snapshot
from kernels.python.resume import restart


@dataclasses.dataclass(frozen=True)
class Built:
    argv: tuple[str, ...]
    env: dict[str, str]  # the environment it was built in, before the shell changed it


_built: Built | None = None


def build(argv: list[str], workdir: str) -> None:
    """Build the application and shell a kernel started with `argv` in this process's
    environment would make, in `workdir` (the parent's own working folder is kept)."""
    global _built
    env = dict(os.environ)
    here = os.getcwd()
    os.chdir(workdir)
    try:
        app = kernelapp.IPKernelApp.instance()
        BaseIPythonApplication.initialize(app, argv)
        # as IPythonKernel.__init__ makes it (its shell_class and compiler_class), but with
        # no kernel yet: the child's kernel takes this instance and sets itself on it
        shell = ZMQInteractiveShell.instance(
            parent=app,
            profile_dir=app.profile_dir,
            user_module=None,
            user_ns=app.user_ns,
            kernel=None,
            compiler_class=XCachingCompiler,
        )
        startup.prepare_shell(shell)
        _enable_inline_matplotlib()
    finally:
        os.chdir(here)
    if threading.active_count() != 1:  # a fork copies only the thread that forks
        raise RuntimeError(f"building the kernel started threads: {threading.enumerate()}")
    _built = Built(tuple(argv), env)


def launch(argv: list[str]) -> None:
    """Start this child's kernel with `argv` and serve until it ends (`os.environ` is the
    request's by now)."""
    built = _built
    if built is None or built.argv != tuple(argv) or built.env != dict(os.environ):
        _launch_unbuilt(argv)
        return
    app: Any = kernelapp.IPKernelApp.instance()
    shell: Any = ZMQInteractiveShell.instance()
    shell.init_environment()  # what the shell sets in os.environ, replaced since the build
    os.makedirs(app.profile_dir.location, exist_ok=True)  # in this sandbox's own /tmp
    app.profile_dir.check_dirs()
    snapshot.listen(restart)
    initialize_again(app, shell, argv)
    app.start()
    if snapshot.kept():  # its run asked to keep its state: a fork of it is the snapshot now
        snapshot.freeze()


def initialize_again(app: Any, shell: Any, argv: list[str]) -> None:
    """ipykernel's `IPKernelApp.initialize` for an application whose first half (its
    command line, config and profile) is done, around `shell`: the connection file,
    sockets, threads, io, signals and a kernel object, which takes `shell`."""
    make_kernel = kernelapp.IPKernelApp.init_kernel

    def init_kernel() -> None:
        make_kernel(app)  # type: ignore[no-untyped-call]
        shell.kernel = app.kernel  # before the extensions: ours reads the kernel's iopub

    app.init_kernel = init_kernel
    # `IPKernelApp.initialize` first calls its base's, which the parent ran: while it runs
    # in this child, the base's is done (and is the base's again after: an IPython
    # application the user makes in the kernel parses its own command line)
    base_initialize = BaseIPythonApplication.initialize
    BaseIPythonApplication.initialize = _done  # type: ignore[method-assign]
    try:
        app.initialize(argv)
    finally:
        BaseIPythonApplication.initialize = base_initialize  # type: ignore[method-assign]
        del app.init_kernel


def _done(self: Any, argv: Any = None) -> None:
    return None


def _launch_unbuilt(argv: list[str]) -> None:
    kernelapp.IPKernelApp.clear_instance()
    ZMQInteractiveShell.clear_instance()
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    if inline is not None:  # its settings are the built shell's: the new one makes its own
        inline.InlineBackend.clear_instance()
    # matplotlib's inline backend chooses a shell's figure formats once per process (a
    # function attribute, so as not to undo a user's choice): the new shell needs its own
    with contextlib.suppress(AttributeError):
        del inline.configure_inline_support.current_backend  # type: ignore[union-attr]
    _integrate_preloaded_matplotlib()
    kernelapp.launch_new_instance(argv=argv)


def _enable_inline_matplotlib() -> None:
    """The parent imported matplotlib's inline backend before any shell existed, so its
    hooks (figures shown after each cell) were never installed: install them on the shell,
    as importing the backend in a kernel would."""
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    enable = getattr(inline, "_enable_matplotlib_integration", None)
    if enable is not None:
        enable()


def _integrate_preloaded_matplotlib() -> None:
    """For a kernel started without the built shell: install matplotlib's inline hooks once
    the new shell loads our startup extension."""
    loaded = startup.load_ipython_extension

    def load_ipython_extension(ipython: Any) -> None:
        loaded(ipython)
        _enable_inline_matplotlib()

    startup.load_ipython_extension = load_ipython_extension
