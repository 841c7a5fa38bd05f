"""`/v1/tools/*`: the seed-compatible tool endpoints, thin adapters over the run pipeline
(the translation both ways lives in `gateway.tools`)."""

from __future__ import annotations

from gateway.handlers.base import BaseHandler
from gateway.models.tools import CodeExecStarted
from gateway.tools.code_exec import code_exec_answer, parse_code_exec
from gateway.tools.code_run import code_run_answer, parse_code_run
from gateway.tools.run_python import parse_run_python, run_python_answer


class CodeRunToolHandler(BaseHandler):
    async def post(self) -> None:
        data = await self.json_body()
        call = await self.heavy(self.small_body, parse_code_run, data, self.policy, self.user)
        record = await self.services.runs.run(call.request, self.hand_over_body())
        await self.send_json(code_run_answer(call, record))


class RunPythonToolHandler(BaseHandler):
    async def post(self) -> None:
        data = await self.json_body()
        call = await self.heavy(
            self.small_body,
            parse_run_python,
            data,
            self.policy,
            self.user,
            archives=self.services.uploads is not None,
        )
        request = call.request
        record = await self.services.runs.run(request, self.hand_over_body())
        await self.send_json(run_python_answer(call, record))


class CodeExecToolHandler(BaseHandler):
    async def post(self) -> None:
        data = await self.json_body()
        call = await self.heavy(self.small_body, parse_code_exec, data, self.policy, self.user)
        runs = self.services.runs
        if call.request.background:
            active = await runs.submit(call.request, self.hand_over_body())
            self.set_header("Location", f"/v1/runs/{active.record.id}")
            await self.send_json(CodeExecStarted(task_id=active.record.id), 202)
            return
        record = await runs.run(call.request, self.hand_over_body())
        await self.send_json(code_exec_answer(call, record))
