"""A background run's request as the store's queue carries it to whichever replica claims
it (`gateway/runs/claims.py`): JSON text, its staged files in base64.

Only a request that needs nothing of the replica that admitted it is carried (`carried`):
a background run (a synchronous or streamed one needs its client, which is connected
here), not continuing a snapshot (`from`: the snapshot is this replica's), not keeping one
(`keep`: the client would find it on a replica it did not choose), and not in a persistent
workspace (`working_dir`: a folder of this machine). What it names in the store travels
as a name: an upload (`archive`) and the files an earlier run kept (`files_from`, checked
when it was admitted), both on the PostgreSQL store's shelf, which every replica reads.

Its size is the body's, bounded by the body limits (a third more for base64).
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

from gateway.execution.program import Program, from_run
from gateway.models.request import RunRequest, StagedFile
from gateway.offload import offload_if

# The form of a carried request. A replica claims only the forms it reads (up to its own:
# the store's `version` column), so during a rolling update older replicas leave newer
# forms to newer ones, and newer ones read older forms, a field added since taking its
# default (what the older replica meant by leaving it out). Add a field to `RunRequest`
# with a default, and bump this (tests/test_queue_claims.py holds the fields to it).
VERSION = 1


class NotCarried(ValueError):
    """A queued request this gateway cannot read (another version's)."""


def carried(request: RunRequest, program: Program) -> bool:
    """Whether the store's queue may carry this run to another replica (see above)."""
    return (
        request.background
        and request.continue_from is None
        and not request.keep
        and request.working_dir is None
        and not program.prelude
    )


async def carry(request: RunRequest, program: Program) -> str:
    """The request's text (its files' bytes decide whether it is encoded off the loop)."""
    size = sum(len(f.data) for f in request.files) + len(request.code or "")
    return await offload_if(size, _encode, request, program)


def _encode(request: RunRequest, program: Program) -> str:
    data: dict[str, Any] = {
        f.name: getattr(request, f.name)
        for f in dataclasses.fields(RunRequest)
        if f.name not in ("files", "working_dir")
    }
    data["files"] = [[f.path, base64.b64encode(f.data).decode("ascii")] for f in request.files]
    data["given_upload"], data["given_from"] = program.given_upload, program.given_from
    return json.dumps({"version": VERSION, "request": data}, separators=(",", ":"))


# What reading a request's text back holds at most, by the text's size: the text, the
# decoded JSON (its strings as long as the text), and the files' bytes (three quarters of
# their base64). The program read back keeps less than the text (its files' bytes and its
# code).
READ_FACTOR = 3


async def unpack(text: str) -> Program:
    """The program a claimed request runs, as the replica that admitted it would have."""
    return await offload_if(len(text), _decode, text)


def _decode(text: str) -> Program:
    try:
        wrapper = json.loads(text)
        version = wrapper.get("version")
        if not isinstance(version, int) or not 1 <= version <= VERSION:
            raise NotCarried(f"a queued request of version {version!r}")
        data: dict[str, Any] = dict(wrapper["request"])
        given = data.pop("given_upload"), data.pop("given_from")
        data["files"] = tuple(StagedFile(p, base64.b64decode(d)) for p, d in data["files"])
        for name in ("notes", "return_files"):
            data[name] = tuple(data[name])
        request = RunRequest(**data)
    except (ValueError, KeyError, TypeError) as exc:
        raise NotCarried(str(exc)[:200]) from None
    program = from_run(request)
    return dataclasses.replace(program, given_upload=given[0], given_from=given[1])
