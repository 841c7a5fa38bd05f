"""`POST /v1/notebooks/run`: replay a notebook in one fresh kernel and answer the executed
notebook with the run record of the whole."""

from __future__ import annotations

from gateway.handlers.base import BaseHandler
from gateway.models.answers import NotebookRunAnswer
from gateway.models.ipynb import record_to_notebook
from gateway.offload import offload
from gateway.runs.requests import parse_notebook_request


class NotebookRunHandler(BaseHandler):
    async def post(self) -> None:
        data = await self.json_body()
        # nbformat's validator is CPU work that grows with the notebook: not on the loop
        request = await offload(parse_notebook_request, data, self.settings_, self.user)
        del data
        record = await self.services.runs.run_notebook(request, self.hand_over_body())
        notebook = await offload(record_to_notebook, record)
        await self.send_json(NotebookRunAnswer(notebook=notebook, run=record.to_json()))
