"""Invalid run requests, one table for every way a run can be asked for: the HTTP body of
`POST /v1/runs` (test_errors.py), a `run` message on the WebSocket (test_stream.py), and the
error answers the OpenAPI document describes (test_openapi.py). None reaches a sandbox.

Each case: (the run's fields, the error code, the field the error names). The status is
403 for `forbidden` and `archive_mode_disabled`, else 400.
"""

from __future__ import annotations

from typing import Any

RUN_FIELD_ERRORS: list[tuple[dict[str, Any], str, str]] = [
    ({"code": "1", "language": "ruby"}, "unsupported_language", "language"),
    ({"code": "1", "timeout": "soon"}, "invalid_request", "timeout"),
    ({"code": "1", "timeout": True}, "invalid_request", "timeout"),
    (
        {"code": "1", "files": [{"path": "../x", "content": ""}]},
        "invalid_path",
        "files[0].path",
    ),
    (
        {"code": "1", "files": [{"path": "/etc/x", "content": ""}]},
        "invalid_path",
        "files[0].path",
    ),
    (
        {"code": "1", "files": [{"path": "a\u0000b", "content": ""}]},
        "invalid_path",
        "files[0].path",
    ),
    (
        {"code": "1", "files": [{"path": "a", "content": "%%", "encoding": "base64"}]},
        "invalid_request",
        "files[0].content",
    ),
    (
        {"code": "1", "files": [{"path": "a", "content": "", "encoding": "rot13"}]},
        "invalid_request",
        "files[0].encoding",
    ),
    (
        {"code": "1", "entrypoint": "a.py", "files": [{"path": "a.py", "content": ""}]},
        "conflicting_fields",
        "entrypoint",
    ),
    ({"language": "python"}, "invalid_request", "code"),
    ({"code": 5}, "invalid_request", "code"),
    ({"entrypoint": "nope.py"}, "invalid_request", "entrypoint"),
    ({"code": "1", "vars": []}, "invalid_request", "vars"),
    ({"code": "1", "language": "bash", "vars": {"1bad": "x"}}, "invalid_request", "vars"),
    ({"code": "1", "env": {"A": 1}}, "invalid_request", "env"),
    ({"code": "1", "return_files": "a"}, "invalid_request", "return_files"),
    ({"code": "1", "nonsense": 1}, "invalid_request", "nonsense"),
    ({"code": "1", "network": True}, "forbidden", "network"),
    ({"code": "1", "archive": "abc"}, "archive_mode_disabled", "archive"),
    ({"code": "1", "working_dir": "proj"}, "forbidden", "working_dir"),
]


def status_of(code: str) -> int:
    return 403 if code in ("forbidden", "archive_mode_disabled") else 400
