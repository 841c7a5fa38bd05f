"""`POST /v1/uploads`: an archive (.zip, .tar.gz) checked and stored for a run's `archive`."""

from __future__ import annotations

from gateway.openapi.common import Schema, errors, json_body, ref
from gateway.uploads.archives import RAW_TYPES

# Each check of an archive has its own code (gateway/uploads/archives.py).
UPLOAD_ERROR_CODES: dict[int, list[str]] = {
    400: [
        "archive_absolute_path",
        "archive_path_traversal",
        "archive_link",
        "archive_special_file",
        "archive_invalid",
        "invalid_request",
    ],
    413: [
        "archive_too_large",
        "archive_unpacked_too_large",
        "archive_too_many_entries",
        "archive_entry_too_large",
        "archive_ratio_exceeded",
    ],
}

SCHEMAS: dict[str, Schema] = {
    "Upload": {
        "type": "object",
        "description": "A stored archive; pass `id` as a run's `archive`.",
        "required": ["id", "entries", "unpacked_bytes"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string"},
            "entries": {
                "type": "integer",
                "minimum": 0,
                "description": "number of entries (files and folders)",
            },
            "unpacked_bytes": {
                "type": "integer",
                "minimum": 0,
                "description": "total size of the files once unpacked",
            },
        },
    },
}

_BINARY = {"schema": {"type": "string", "format": "binary"}}

PATHS: dict[str, Schema] = {
    "/v1/uploads": {
        "post": {
            "operationId": "upload",
            "tags": ["uploads"],
            "summary": "Upload a .zip or .tar.gz/.tgz for later runs",
            "description": (
                "Off unless the operator enabled uploads (`--allow-uploads`): 403 "
                "archive_mode_disabled. The body is the archive itself (raw: any of the media "
                "types below, `application/x-www-form-urlencoded` as `curl --data-binary` "
                "sends, or none) or a multipart/form-data form holding exactly one file; the "
                "format is told by the archive's first bytes. Everything is checked before "
                "anything is unpacked, and again while unpacking. Each violation has its own "
                "code: 413 "
                + ", ".join(UPLOAD_ERROR_CODES[413])
                + "; 400 "
                + ", ".join(UPLOAD_ERROR_CODES[400])
                + " (a malformed multipart body or not exactly one file). Uploads belong to "
                "the caller and are kept for `upload_ttl` (default 24 h); each user keeps at "
                "most `max_uploads_per_user` (default 100) of at most "
                "`max_upload_store_bytes_per_user` (default 512 MiB) stored bytes in all: a "
                "new upload deletes the caller's oldest past that (a run naming a deleted "
                "upload is 404, as for an expired one). Browsers: the cross-site rules of "
                "every endpoint apply (a form on another site cannot upload)."
            ),
            "requestBody": {
                "required": True,
                "content": {
                    **{media: _BINARY for media in RAW_TYPES},
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "required": ["file"],
                            "properties": {"file": {"type": "string", "format": "binary"}},
                        }
                    },
                },
            },
            "responses": {
                "201": json_body(ref("Upload"), "The archive passed every check and is stored."),
                **errors(400, 401, 403, 413, 415),
            },
            "x-error-codes": {str(k): v for k, v in UPLOAD_ERROR_CODES.items()},
        }
    },
}
