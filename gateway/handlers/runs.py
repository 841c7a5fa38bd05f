"""`/v1/runs`: run code and wait, poll, cancel, export as a notebook."""

from __future__ import annotations

import nbformat

from gateway.handlers.base import BaseHandler
from gateway.models.answers import RunAccepted
from gateway.models.ipynb import record_to_notebook
from gateway.runs.archives import check_archive
from gateway.runs.requests import parse_run_request


class RunsHandler(BaseHandler):
    async def post(self) -> None:
        request = parse_run_request(self.json_body(), self.settings_, self.user)
        await check_archive(self.services.uploads, request.archive, request.user)
        runs = self.services.runs
        if request.background:
            active = await runs.submit(request)
            self.set_header("Location", f"/v1/runs/{active.record.id}")
            self.send_json(RunAccepted(id=active.record.id, status=active.record.status), 202)
            return
        record = await runs.run(request)
        self.send_json(record.to_json())


class RunHandler(BaseHandler):
    async def get(self, run_id: str) -> None:
        record = await self.services.runs.get(run_id, self.user.user, self.user.is_admin)
        self.send_json(record.to_json())

    async def delete(self, run_id: str) -> None:
        record = await self.services.runs.cancel(run_id, self.user.user, self.user.is_admin)
        self.send_json(record.to_json())


class RunNotebookHandler(BaseHandler):
    async def get(self, run_id: str) -> None:
        record = await self.services.runs.get(run_id, self.user.user, self.user.is_admin)
        notebook = record_to_notebook(record)
        self.set_header("Content-Type", "application/x-ipynb+json")
        self.set_header("Content-Disposition", f'attachment; filename="{run_id}.ipynb"')
        self.finish(nbformat.writes(notebook))
