"""`POST /v1/notebooks/run`: replay a notebook in one fresh kernel and answer the executed
notebook with the run record of the whole."""

from __future__ import annotations

import asyncio

from gateway.handlers.base import BaseHandler
from gateway.models.answers import NotebookRunAnswer
from gateway.models.ipynb import record_to_notebook
from gateway.runs.requests import parse_notebook_request


class NotebookRunHandler(BaseHandler):
    async def post(self) -> None:
        body = self.json_body()
        # nbformat's validator is CPU work that grows with the notebook: not on the loop
        request = await asyncio.to_thread(parse_notebook_request, body, self.settings_, self.user)
        record = await self.services.runs.run_notebook(request)
        notebook = await asyncio.to_thread(record_to_notebook, record)
        self.send_json(NotebookRunAnswer(notebook=notebook, run=record.to_json()))
