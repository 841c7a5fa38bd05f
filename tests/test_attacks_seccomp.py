"""The system-call filter of the backends that have one (Docker and forkserver: one
allowlist, `gateway/sandbox/seccomp.py`; the local backend has none): AF_VSOCK, which
reaches the machine's vsock services past every network namespace, stays out however the
call is made. Docker's default profile checks `socket`'s family on the whole 64-bit
register (`!= 40`), so a family with a bit above the int's 32 passed it and the kernel,
which reads an int, made an AF_VSOCK socket; the Docker backend now gives its containers
this filter instead."""

from __future__ import annotations

import pytest

from tests.support import Client

pytestmark = pytest.mark.attack

SOCKETS = r"""
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def socket(family):
    ctypes.set_errno(0)
    fd = libc.syscall(41, ctypes.c_long(family), 1, 0)  # socket(family, SOCK_STREAM, 0)
    return 'ok' if fd >= 0 else errno.errorcode[ctypes.get_errno()]
result = {
    'vsock': socket(40),
    'vsock_high_bits': socket(0x100000028),
    'vsock_sign_bit': socket(-0x100000000 + 40),
    'unix': socket(1),
    'inet': socket(2),
}
"""


def test_no_kernel_makes_an_af_vsock_socket(client: Client, backend: str) -> None:
    if backend == "local":
        pytest.skip("the local backend has no system-call filter (README, isolation table)")
    record = client.run(code=SOCKETS)
    assert record["status"] == "succeeded", record
    assert record["result"] == {
        "vsock": "EPERM",
        "vsock_high_bits": "EPERM",
        "vsock_sign_bit": "EPERM",
        "unix": "ok",
        "inet": "ok",
    }
