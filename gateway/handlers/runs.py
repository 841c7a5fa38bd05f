"""`/v1/runs`: run code and wait, list, poll, cancel, export as a notebook."""

from __future__ import annotations

import functools
from typing import Any

from gateway.handlers.base import BaseHandler
from gateway.models.answers import RunAccepted
from gateway.models.ipynb import record_to_notebook
from gateway.runs.listing import list_runs, listing_query
from gateway.runs.requests import parse_run_request

NOTEBOOK_TYPE = "application/x-ipynb+json"


class RunsHandler(BaseHandler):
    async def post(self) -> None:
        data = await self.json_body()
        request = await self.heavy(self.small_body, parse_run_request, data, self.policy, self.user)
        runs = self.services.runs
        if request.background:
            active = await runs.submit(request, self.hand_over_body())
            self.set_header("Location", f"/v1/runs/{active.record.id}")
            await self.send_json(RunAccepted(id=active.record.id, status=active.record.status), 202)
            return
        record = await runs.run(request, self.hand_over_body())
        await self.send_json(record.to_json())

    async def get(self) -> None:
        """A page of the caller's runs (`gateway.runs.listing`)."""
        query = listing_query(self.request.query_arguments, self.user)
        await self.send_json(await list_runs(self.services.runs.store, query))


class RunHandler(BaseHandler):
    async def get(self, run_id: str) -> None:
        await self.send_loaded(functools.partial(self._record, run_id))

    async def _record(self, run_id: str) -> dict[str, Any]:
        record = await self.services.runs.get(run_id, self.user.user, self.user.is_admin)
        return record.to_json()

    async def delete(self, run_id: str) -> None:
        record = await self.services.runs.cancel(run_id, self.user.user, self.user.is_admin)
        await self.send_json(record.to_json())


class RunNotebookHandler(BaseHandler):
    async def get(self, run_id: str) -> None:
        self.set_header("Content-Disposition", f'attachment; filename="{run_id}.ipynb"')
        await self.send_loaded(
            functools.partial(self._notebook, run_id), content_type=NOTEBOOK_TYPE
        )

    async def _notebook(self, run_id: str) -> dict[str, Any]:
        record = await self.services.runs.get(run_id, self.user.user, self.user.is_admin)
        return await self.heavy(False, record_to_notebook, record)
