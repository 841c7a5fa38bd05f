"""Work too heavy for the event loop: encoding or parsing megabytes of JSON, converting and
validating notebooks, cutting large records, checking a large kernel message's signature.

It runs in a small pool of threads of its own (`WORKERS`), never in asyncio's default
executor, which the Docker SDK's calls and file staging share: a burst of heavy requests
then waits for a worker instead of taking every thread the engine calls need. The threads
share the GIL with the loop. Python code there only slows the loop (CPython hands the GIL
back every switch interval, 5 ms), but one long call into C that keeps the GIL (a
`json.dumps` or `json.loads` of tens of megabytes) freezes it for that call's length: such
work is cut into pieces of about a megabyte (`handlers/encode.py` encodes answers so), or
kept small by the bounds upstream. Small work (`SMALL` bytes or less) runs inline: a thread
hop costs more than it saves.

The pool is made on first use and lives as long as the process, as asyncio's own default
executor does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

WORKERS = 2
SMALL = 256 * 1024  # bytes of input below which work runs inline

P = ParamSpec("P")
T = TypeVar("T")

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=WORKERS, thread_name_prefix="gateway-heavy"
            )
        return _pool


async def offload(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)` in the heavy-work pool; its result or its exception."""
    loop = asyncio.get_running_loop()
    call = functools.partial(function, *args, **kwargs)
    return await loop.run_in_executor(_executor(), call)


async def offload_if(size: int, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """As `offload`, but inline when the work's input is `SMALL` bytes or less."""
    if size <= SMALL:
        return function(*args, **kwargs)
    return await offload(function, *args, **kwargs)
