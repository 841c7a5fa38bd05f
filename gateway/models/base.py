"""What every body that crosses the API shares: strict parsing, and one translation of a
pydantic `ValidationError` into the API's error shape.

- Strict: no coercion (`"1"` is not a number, `true` is not one either), unknown fields are
  refused (400 `invalid_request`, `field` naming the first), NaN and infinities too.
- An explicit `null` is the same as leaving a field out, everywhere (docs/API.md).
- A validator that needs one of our error codes raises `PydanticCustomError(code, ...)`
  with that code as its type (`invalid_path`, `unsupported_language`, ...); anything else
  is `invalid_request`. `field` is the location as a path: `files[2].path`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    GetJsonSchemaHandler,
    RootModel,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from gateway.errors import (
    ConflictingFields,
    Forbidden,
    GatewayError,
    InvalidPath,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedLanguage,
)
from gateway.models.common import LANGUAGES

B = TypeVar("B", bound="Body")
T = TypeVar("T")

# Our error codes a validator may raise as a PydanticCustomError type.
_CODES: dict[str, type[GatewayError]] = {
    "invalid_request": InvalidRequest,
    "invalid_path": InvalidPath,
    "unsupported_language": UnsupportedLanguage,
    "conflicting_fields": ConflictingFields,
    "payload_too_large": PayloadTooLarge,
    "forbidden": Forbidden,
}

_EXPECTED = {
    "string_type": "a string",
    "int_type": "a whole number",
    "float_type": "a number",
    "bool_type": "true or false",
    "dict_type": "an object",
    "list_type": "a list",
    "model_type": "an object",
    "finite_number": "a finite number",
}


def component(name: str, description: str | None = None) -> WithJsonSchema:
    """A field kept as plain JSON at run time whose schema in the OpenAPI document is the
    component `name` (nbformat's outputs, a chart, ...)."""
    schema: dict[str, Any] = {"$ref": f"#/components/schemas/{name}"}
    if description:
        schema["description"] = description
    return WithJsonSchema(schema)


class Body(BaseModel):
    """A JSON body (or part of one) the API accepts."""

    model_config = ConfigDict(
        strict=True, extra="forbid", allow_inf_nan=False, populate_by_name=True
    )
    # field paths of objects whose keys are the caller's names (see `field_path`)
    keyed_fields: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _null_is_omitted(cls, data: Any) -> Any:
        """An explicit null is the same as leaving the field out (at every level); a null
        under a name the body does not have is still an unknown field."""
        if isinstance(data, Mapping):
            known = cls.model_fields
            return {k: v for k, v in data.items() if v is not None or k not in known}
        return data

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The JSON Schema says what `_null_is_omitted` does: every optional field accepts
        null."""
        json_schema = handler(core_schema)
        if handler.mode == "validation":
            target = handler.resolve_ref_schema(json_schema)
            required = set(target.get("required", ()))
            for name, field in target.get("properties", {}).items():
                if name not in required and not _accepts_null(field):
                    target["properties"][name] = _or_null(field)
        return json_schema

    @classmethod
    def parse(cls: type[B], data: Any, prefix: str = "") -> B:
        """Validate decoded JSON; every problem is the API's GatewayError."""
        if not isinstance(data, Mapping):
            raise InvalidRequest(
                "The request body must be a JSON object.", field=prefix.rstrip(".") or None
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise translate(exc, prefix, cls.keyed_fields) from None


class Answer(BaseModel):
    """A JSON body the API sends: built by the gateway, validated as it is built, and sent
    as `sent` says (no null-is-omitted parsing: a required field may be null)."""

    model_config = ConfigDict(extra="forbid")


def _accepts_null(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "null" or any(
        option.get("type") == "null" for option in schema.get("anyOf", ())
    )


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` or null; what describes the field (default, description) stays outside."""
    outer: dict[str, Any] = {k: schema[k] for k in ("default", "description") if k in schema}
    inner = {key: value for key, value in schema.items() if key not in outer}
    return {"anyOf": [inner, {"type": "null"}], **outer}


def field_path(
    loc: tuple[int | str, ...], prefix: str = "", keyed: frozenset[str] = frozenset()
) -> str:
    """`("files", 2, "path")` -> `files[2].path`. Under a path in `keyed` (an object of
    name -> value, like run_python's `params.files`) the next part is a key:
    `("params", "files", "a.py")` -> `params.files["a.py"]`, for the key or its value."""
    path = prefix.rstrip(".")
    key_next = False
    for part in loc:
        if key_next:
            path += f"[{json.dumps(part, ensure_ascii=False)}]"
        elif part == "[key]":  # pydantic's marker after a key that failed
            continue
        elif isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else str(part)
        key_next = path in keyed
    return path


def translate(
    exc: ValidationError, prefix: str = "", keyed: frozenset[str] = frozenset()
) -> GatewayError:
    """The API's error for the first problem pydantic found."""
    errors = exc.errors(include_url=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        names = [field_path(e["loc"], prefix, keyed) for e in unknown]
        return InvalidRequest(f"Unknown field(s): {', '.join(names)}.", field=names[0])
    error = errors[0]
    field = field_path(error["loc"], prefix, keyed) or None
    kind = error["type"]
    if kind == "literal_error" and error["loc"][-1:] == ("language",):
        return UnsupportedLanguage(
            f"The language {error['input']!r} is not supported; use one of: "
            f"{', '.join(LANGUAGES)}.",
            field=field,
        )
    if kind in _CODES:
        return _CODES[kind](error["msg"], field=field)
    if kind == "missing":
        return InvalidRequest(f"`{field}` is required.", field=field)
    if kind in _EXPECTED:
        return InvalidRequest(f"`{field}` must be {_EXPECTED[kind]}.", field=field)
    return InvalidRequest(f"`{field}`: {error['msg']}.", field=field)


def refuse(code: str, message: str) -> PydanticCustomError:
    """A validator's error with one of our codes (see the module docstring)."""
    return PydanticCustomError(code, message)


def checked(validate: Callable[[T], T], value: T, field: str) -> T:
    """Run one of the models' validators outside a model (an archive's entry names are
    paths too): its error becomes the API's, naming `field`."""
    try:
        return validate(value)
    except PydanticCustomError as exc:
        raise _CODES.get(exc.type, InvalidRequest)(exc.message(), field=field) from None


def sent(value: Any) -> Any:
    """A model as the API sends it: plain JSON, where an optional field that is null is
    left out and a required one is sent as null (`exit_code: null`, but no `notes`)."""
    if isinstance(value, RootModel):
        return sent(value.root)
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        data = {
            name: sent(getattr(value, name))
            for name, field in fields.items()
            if field.is_required() or getattr(value, name) is not None
        }
        data.update((name, sent(item)) for name, item in (value.model_extra or {}).items())
        return data
    # plain JSON (a record's outputs, a notebook) is sent as it is, never walked
    if isinstance(value, list | tuple) and any(isinstance(i, BaseModel) for i in value):
        return [sent(item) for item in value]
    if isinstance(value, Mapping) and any(isinstance(i, BaseModel) for i in value.values()):
        return {key: sent(item) for key, item in value.items()}
    return value
