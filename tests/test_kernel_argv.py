"""The Python kernel's command line (`sandbox/kernelspec.py`) says only what ipykernel
takes: an option it does not know is warned about in every kernel's log, on every start,
and does nothing (`--IPKernelApp.interrupt_mode=message` was one: interrupt mode is the
kernelspec's, a client's business; the gateway interrupts with a message anyway)."""

from __future__ import annotations

import logging

import pytest
from ipykernel.kernelapp import IPKernelApp

from gateway.sandbox.kernelspec import kernel_argv

pytestmark = pytest.mark.fast


def test_every_option_of_the_python_kernels_command_line_is_known(
    caplog: pytest.LogCaptureFixture,
) -> None:
    argv = kernel_argv("python", "python3", "/run/kernel/connection.json")
    options = argv[argv.index("-f") :]
    assert any(o.startswith("--IPKernelApp.extensions") for o in options)
    app = IPKernelApp()
    try:
        with caplog.at_level(logging.WARNING):
            app.log.addHandler(caplog.handler)
            app.parse_command_line(options)
    finally:
        app.log.removeHandler(caplog.handler)
        IPKernelApp.clear_instance()
    assert not [r.getMessage() for r in caplog.records if "not recognized" in r.getMessage()]
    assert app.connection_file == "/run/kernel/connection.json"
