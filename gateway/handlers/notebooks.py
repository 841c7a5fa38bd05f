"""`POST /v1/notebooks/run`: replay a notebook in one fresh kernel and answer the executed
notebook with the run record of the whole."""

from __future__ import annotations

from gateway.handlers.base import BaseHandler
from gateway.models.answers import NotebookRunAnswer
from gateway.models.ipynb import record_to_notebook
from gateway.models.notebook import notebook_text, scan_text
from gateway.offload import SMALL
from gateway.runs.requests import parse_notebook_request


class NotebookRunHandler(BaseHandler):
    notebook_body = True

    async def post(self) -> None:
        data = await self.json_body()
        text = notebook_text(data)
        if text is not None:  # sent as its JSON text: room for what parsing that makes too
            limits = self.json_limits()
            shape = await self.heavy(len(text) <= SMALL, scan_text, text, limits)
            self.take_room(shape.parsed_bytes())
        # nbformat's validator is CPU work that grows with the notebook: not on the loop
        request = await self.heavy(False, parse_notebook_request, data, self.policy, self.user)
        del data, text
        self.keep_room()
        record = await self.services.runs.run_notebook(request, self.hand_over_body())
        notebook = await self.heavy(False, record_to_notebook, record)
        await self.send_json(NotebookRunAnswer(notebook=notebook, run=record.to_json()))
