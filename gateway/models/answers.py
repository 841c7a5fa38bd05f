"""Answers that are small fixed shapes (health, a background run, an upload, an error, a
notebook replay). The handlers build them with these models, which are also the
description the OpenAPI document's schemas are generated from."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from gateway.models.base import Answer, component
from gateway.models.common import Status


class Kernels(Answer):
    running: int = Field(ge=0)
    pooled: int = Field(ge=0, description="started kernels waiting, never used (0 without a pool)")


class Pool(Answer):
    size: int = Field(ge=0, description="the kernels this pool keeps ready")
    ready: int = Field(ge=0)
    starting: int = Field(ge=0)
    hits: int = Field(ge=0, description="runs that took a pooled kernel")
    misses: int = Field(ge=0, description="runs that had to start their own")


class StoreHealth(Answer):
    kind: Literal["sqlite", "postgresql"] = Field(
        description="where runs are kept: `sqlite` (one gateway) or `postgresql` (replicas)"
    )
    ok: bool = Field(description="the store answered just now")


DETAILS = (
    "Only for an admin's token or the operator's metrics token (or on a single-user "
    "gateway): to anyone else, a user's token included, health says only `status`"
)


class Health(Answer):
    status: Literal["ok", "draining", "store_unavailable"] = Field(
        description="`draining` after SIGTERM: running runs finish, new ones get 429. "
        "`store_unavailable` (answered with 503): the run store cannot be reached, so this "
        "gateway is not ready for new runs"
    )
    backend: str | None = Field(
        None,
        description="the sandbox backend the gateway started with: `docker`, `local`, or "
        f"another installed as a plug-in. {DETAILS}",
    )
    store: StoreHealth | None = Field(None, description=DETAILS)
    kernels: Kernels | None = Field(None, description=DETAILS)
    pools: dict[str, Pool] | None = Field(
        None, description=f"the warm pools, by kind of kernel. {DETAILS}"
    )
    version: str | None = Field(None, description=DETAILS)


class RunAccepted(Answer):
    """The answer to a background run."""

    id: str
    status: Status


class Upload(Answer):
    """A stored archive; pass `id` as a run's `archive`."""

    id: str
    entries: int = Field(ge=0, description="number of entries (files and folders)")
    unpacked_bytes: int = Field(ge=0, description="total size of the files once unpacked")


class ErrorBody(Answer):
    code: str = Field(pattern="^[a-z][a-z0-9_]*$", description="snake_case, stable: branch on this")
    message: str = Field(min_length=1, description="a human sentence")
    field: str | None = Field(
        None, description="the request field at fault, e.g. `timeout` or `files[0].path`"
    )
    instance: str | None = Field(
        None,
        description=(
            "`snapshot_elsewhere` only: the gateway instance that holds the snapshot (resend "
            "with `X-Gateway-Instance: <instance>`)"
        ),
    )


class Error(Answer):
    """Every error answer (never HTML, never a stack trace). `x-error-codes` lists the codes
    by HTTP status. User code that fails is not an error answer: it is a 200 run record
    with `status: failed`."""

    error: ErrorBody


class NotebookRunAnswer(Answer):
    model_config = ConfigDict(extra="allow")

    notebook: Annotated[
        dict[str, Any],
        component(
            "Notebook",
            "the executed notebook (valid nbformat v4): each code cell with its outputs and "
            "execution_count",
        ),
    ]
    run: Annotated[
        dict[str, Any],
        component(
            "RunRecord",
            "one record for the whole notebook: status, exit_code, timing, usage, charts and "
            "returned files of all cells; stdout/stderr/output/outputs of all cells in order",
        ),
    ]
