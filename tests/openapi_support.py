"""What the OpenAPI tests share: the document, and validating answers against its schemas
and its error codes. (The gateway they share, `fuzz_gateway`, is in conftest.py.)"""

from __future__ import annotations

import secrets
from typing import Any

import jsonschema
from openapi_spec_validator import validate

from gateway.openapi import build_document

# the token of `fuzz_gateway` (conftest.py); made here, in a module imported only once
FUZZ_TOKEN = "fuzz-" + secrets.token_hex(16)


def checked_document() -> dict[str, Any]:
    """The gateway's OpenAPI document, once an independent validator
    (openapi-spec-validator) has found it valid OpenAPI 3.1: only then is it an oracle for
    the answers (an invalid one fails every module that imports this one)."""
    document = build_document()
    validate(document)
    return document


DOC = checked_document()

# The error codes by status as docs/API.md ("Conventions") lists them, written here by hand:
# the document's own list (gateway.openapi.ERROR_CODES) is held to this one
# (test_openapi.py), never used as the oracle.
DOCUMENTED_ERRORS: dict[int, set[str]] = {
    400: {
        "invalid_request",
        "unsupported_language",
        "invalid_path",
        "conflicting_fields",
        "snapshot_unsupported",
    },
    401: {"unauthorized"},
    403: {"forbidden", "archive_mode_disabled"},
    404: {"not_found"},
    405: {"method_not_allowed"},
    409: {"snapshot_elsewhere"},
    410: {"snapshot_gone", "files_gone"},
    413: {"payload_too_large"},
    415: {"unsupported_media_type"},
    429: {"capacity", "quota"},
    500: {"internal"},
    503: {"capacity", "sandbox_unavailable", "store_unavailable"},
}
METHODS = ("get", "post", "put", "delete", "patch")


def schema_validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator for one component schema (its $refs resolve inside the document)."""
    root = {"$ref": f"#/components/schemas/{name}", "components": DOC["components"]}
    return jsonschema.Draft202012Validator(root, format_checker=jsonschema.FormatChecker())


def assert_valid(name: str, instance: Any) -> None:
    errors = sorted(schema_validator(name).iter_errors(instance), key=lambda e: list(e.path))
    assert not errors, f"{name}: " + "; ".join(
        f"{list(e.absolute_path)}: {e.message[:300]}" for e in errors[:5]
    )


def error_codes(path: str | None, method: str | None, status: int) -> set[str]:
    codes = set(DOCUMENTED_ERRORS.get(status, set()))
    if path is not None and method is not None:
        operation = DOC["paths"][path][method]
        codes |= set(operation.get("x-error-codes", {}).get(str(status), []))
    return codes


def assert_error_answer(status: int, body: Any, path: str | None, method: str | None) -> None:
    assert_valid("Error", body)
    code = body["error"]["code"]
    assert code in error_codes(path, method, status), f"{status} {code} is not documented"
    if path is not None and method is not None:
        assert str(status) in DOC["paths"][path][method]["responses"], (path, method, status)
