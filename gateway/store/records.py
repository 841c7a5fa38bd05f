"""A run record as the stores keep it: JSON text. A record may be 64 MiB (`max_record_bytes`)
and a replay's notebook hundreds of thousands of cells, so a large one is encoded and
decoded in the heavy-work pool (`gateway.offload`), never on the event loop.

Whether a record is large is guessed without encoding it: the lengths of its strings,
visiting at most `VISITS` values; a record with more values than that counts as large.

A thread alone does not keep the loop turning: CPython's C JSON encoder and decoder hold
the GIL from start to end, so the event loop (and the heartbeat's thread) wait for the
whole call wherever it runs. Measured, offloaded: a 400k-cell notebook's 19 MiB stalled
the loop 203 ms through `json.dumps`, 86 ms through `JSONEncoder.iterencode` (Python
code around the C string escaping, which hands the GIL over every switch interval; 5x the
CPU); 64 MiB of outputs 181 ms and 42 ms. So a large record is encoded by `iterencode`.
Decoding has no such form in the standard library: `json.loads` of the same notebook holds
the GIL 660 ms, well within a lease, and is still moved off the loop's own work.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.models.listing import summary_json
from gateway.models.record import RunRecord
from gateway.offload import SMALL, offload_if

VISITS = 512
LARGE = SMALL + 1
_SEPARATORS = (",", ":")
_ENCODER = json.JSONEncoder(separators=_SEPARATORS)


def encode(data: dict[str, Any]) -> str:
    """The JSON of a record's `to_storage()`; a large one in turns (see above)."""
    if guess_size(data) <= SMALL:
        return json.dumps(data, separators=_SEPARATORS)
    return "".join(_ENCODER.iterencode(data))


def decode(payload: str | bytes) -> RunRecord:
    return RunRecord.from_storage(json.loads(payload))


async def dump(record: RunRecord) -> str:
    """The record's stored JSON. Its fields are read here, on the loop (a shallow copy:
    the run may go on changing the record); only the encoding is moved off it."""
    data = record.to_storage()
    return await offload_if(guess_size(data), encode, data)


async def load(payload: str | bytes) -> RunRecord:
    return await offload_if(len(payload), decode, payload)


def guess_size(value: Any) -> int:
    """About how many bytes `value` takes as JSON (its strings' lengths), or `LARGE` when it
    holds more than `VISITS` values: cheap whatever its size."""
    size, visits, stack = 0, 0, [value]
    while stack and size < LARGE:
        item = stack.pop()
        visits += 1
        if isinstance(item, dict | list | tuple):
            visits += len(item)
            if visits > VISITS:
                return LARGE
            stack.extend(item.values() if isinstance(item, dict) else item)
            size += 8 * len(item)  # keys, separators
        else:
            size += len(item) if isinstance(item, str | bytes) else 8
    return size


def summary(record: RunRecord) -> str:
    """The JSON of the record's summary (`GET /v1/runs`), kept beside it: small, whatever
    the record's size (only the head of its code is read)."""
    fields = {
        "id": record.id,
        "status": record.status,
        "language": record.language,
        "kind": record.kind,
        "created_at": record.created_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "code": record.code,
        "exit_code": record.exit_code,
        "continued_from": record.continued_from,
        "name": record.name,
    }
    return json.dumps(summary_json(fields), separators=_SEPARATORS)


async def summary_of_stored(payload: str | bytes) -> dict[str, Any]:
    """The summary of a stored record that has none beside it (kept by an older gateway)."""
    return dict(json.loads(summary(await load(payload))))
