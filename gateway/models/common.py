"""The small shared vocabulary at the bottom of the gateway: languages, statuses, kill
reasons, run ids and timestamps. Everything imports it; it imports nothing of ours."""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Literal

Language = Literal["python", "bash", "javascript", "typescript", "r"]
LANGUAGES: tuple[Language, ...] = ("python", "bash", "javascript", "typescript", "r")

Status = Literal["queued", "running", "succeeded", "failed", "timed_out", "killed", "cancelled"]
FINAL_STATUSES: frozenset[str] = frozenset(
    {"succeeded", "failed", "timed_out", "killed", "cancelled"}
)
KillReason = Literal["timeout", "memory", "output_limit", "pids", "cancelled", "cpu_quota"]


# what a run id may look like where one is named (URLs, a WebSocket `cancel`): ours, or a
# caller's own name for a record the gateway has never made (then simply not found)
RUN_ID_PATTERN = r"(run_[0-9a-f]{1,64}|[A-Za-z0-9_-]{1,100})"


def new_run_id() -> str:
    return "run_" + secrets.token_hex(10)


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
