"""The document's component schemas, generated: request bodies from the pydantic models that
parse them, answers from the models that describe them, notebooks and outputs from
nbformat's own v4 JSON schema. Nothing here restates a shape."""

from __future__ import annotations

import importlib.resources
import json
import re
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, models_json_schema

from gateway.models import (
    answers,
    environment,
    listing,
    notebook,
    record,
    run,
    stream,
    tools,
    usage,
)

Schema = dict[str, Any]
PREFIX = "#/components/schemas/"
LINE_BREAK = re.compile(r"(?<!\n)\n(?!\n)")

# (model, the name the document gives it); bodies are described as pydantic validates them,
# answers as they are sent.
BODIES: tuple[tuple[type[BaseModel], str], ...] = (
    (run.RunBody, "RunRequest"),
    (run.FileBody, "StagedFile"),
    (notebook.NotebookBody, "NotebookRunRequest"),
    (stream.RunMessage, "StreamRunMessage"),
    (stream.CancelMessage, "StreamCancelMessage"),
    (notebook.NotebookMessage, "StreamNotebookMessage"),
    (tools.CodeRunBody, "CodeRunRequest"),
    (tools.RunPythonBody, "RunPythonRequest"),
    (tools.CodeExecBody, "CodeExecRequest"),
)
ANSWERS: tuple[tuple[type[BaseModel], str], ...] = (
    (record.RunRecord, "RunRecord"),
    (record.RunError, "RunError"),
    (record.Chart, "Chart"),
    (record.ReturnedFile, "ReturnedFile"),
    (record.SnapshotInfo, "Snapshot"),
    (record.SnapshotList, "SnapshotList"),
    (usage.UsageList, "UsageList"),
    (answers.Error, "Error"),
    (answers.Health, "Health"),
    (environment.Environment, "Environment"),
    (answers.RunAccepted, "RunAccepted"),
    (answers.Upload, "Upload"),
    (answers.NotebookRunAnswer, "NotebookRunAnswer"),
    (stream.AcceptedEvent, "StreamAcceptedMessage"),
    (stream.OutputEvent, "StreamOutputMessage"),
    (stream.OutputDroppedEvent, "StreamOutputDroppedMessage"),
    (stream.DoneEvent, "StreamDoneMessage"),
    (stream.ErrorEvent, "StreamErrorMessage"),
    (stream.CellStartedEvent, "StreamCellStartedMessage"),
    (stream.CellFinishedEvent, "StreamCellFinishedMessage"),
    (listing.RunSummary, "RunSummary"),
    (listing.RunList, "RunList"),
    (tools.CodeRunAnswer, "CodeRunAnswer"),
    (tools.RunPythonAnswer, "RunPythonAnswer"),
    (tools.CodeExecAnswer, "CodeExecAnswer"),
    (tools.CodeExecStarted, "CodeExecStarted"),
)
RENAMES = {model.__name__: name for model, name in BODIES + ANSWERS}


class _Generator(GenerateJsonSchema):
    def normalize_name(self, name: str) -> str:
        return RENAMES.get(name, super().normalize_name(name))

    def handle_ref_overrides(self, json_schema: Any) -> Any:
        if json_schema.get("$ref") not in self.json_to_defs_refs:
            return json_schema  # a component of ours the models name (`component()`)
        return super().handle_ref_overrides(json_schema)

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False  # a property's title only restates its name


def _generated(models: tuple[tuple[type[BaseModel], str], ...], mode: JsonSchemaMode) -> Schema:
    _, document = models_json_schema(
        [(model, mode) for model, _ in models],
        ref_template=PREFIX + "{model}",
        schema_generator=_Generator,
    )
    defs: Schema = document["$defs"]
    for schema in defs.values():
        schema.pop("title", None)
        if "description" in schema:  # a docstring's line breaks are not the text's
            schema["description"] = LINE_BREAK.sub(" ", schema["description"])
    return defs


def nbformat_schemas() -> Schema:
    """nbformat's v4 schema: the notebook as `Notebook`, each definition as
    `nbformat.<name>` (`misc`'s as `nbformat.misc.<name>`), outputs as `Output`."""
    text = importlib.resources.files("nbformat.v4").joinpath("nbformat.v4.schema.json")
    raw = json.loads(text.read_text(encoding="utf-8"))
    text_refs = json.dumps(raw).replace('"#/definitions/misc/', f'"{PREFIX}nbformat.misc.')
    schema = json.loads(text_refs.replace('"#/definitions/', f'"{PREFIX}nbformat.'))
    definitions = schema.pop("definitions")
    schema.pop("$schema")
    out: Schema = {f"nbformat.misc.{k}": v for k, v in definitions.pop("misc").items()}
    out.update({f"nbformat.{k}": v for k, v in definitions.items()})
    out["Notebook"] = schema
    out["Output"] = {
        "$ref": PREFIX + "nbformat.output",
        "description": (
            "One nbformat v4 output, exactly as an .ipynb code cell holds it. Consecutive "
            "stream outputs of the same name are merged in the run record. When output was "
            "cut (see `output_truncated`), a stderr stream output with the marker "
            "`[... N bytes truncated ...]` stands where the middle was."
        ),
    }
    return out


def component_schemas(error_codes: dict[int, list[str]]) -> Schema:
    """Every schema of the document, by name."""
    schemas = _generated(BODIES, "validation")
    for name, schema in _generated(ANSWERS, "serialization").items():
        if schemas.setdefault(name, schema) != schema:
            raise RuntimeError(f"{name} differs as a body and as an answer")
    schemas.update(nbformat_schemas())
    schemas["Error"]["x-error-codes"] = {str(k): v for k, v in error_codes.items()}
    return dict(sorted(schemas.items()))
