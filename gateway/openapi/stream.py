"""`/v1/stream`: the WebSocket for live output. OpenAPI has no WebSocket operations, so
the handshake is documented as a GET and the protocol in its description and in
`x-websocket-messages`, whose schemas are ordinary components."""

from __future__ import annotations

from gateway.openapi.common import Schema, errors, ref

_REF: Schema = {
    "anyOf": [{"type": "string", "maxLength": 256}, {"type": "integer"}, {"type": "null"}],
    "description": "the client's name for a run (at most 256 characters, or an integer)",
}

SCHEMAS: dict[str, Schema] = {
    "StreamRunMessage": {
        "description": (
            "client -> gateway: start a run. The fields of POST /v1/runs (validated the same "
            "way) plus `type` and `ref`; `ref` is echoed in every message about the run and "
            "must not name a run of this connection still in progress. `background` has no "
            "effect here."
        ),
        "allOf": [ref("RunRequest")],
        "required": ["type"],
        "properties": {"type": {"const": "run"}, "ref": _REF},
    },
    "StreamCancelMessage": {
        "type": "object",
        "description": (
            "client -> gateway: cancel a run (by `id`, or by the `ref` of a run of this "
            "connection); its `done` message follows with `status: cancelled`. An unknown "
            "id is an `error` message with code not_found."
        ),
        "required": ["type"],
        "anyOf": [{"required": ["id"]}, {"required": ["ref"]}],
        "properties": {"type": {"const": "cancel"}, "id": {"type": "string"}, "ref": _REF},
    },
    "StreamAcceptedMessage": {
        "type": "object",
        "description": "gateway -> client: the run was admitted and has this id.",
        "required": ["type", "ref", "id"],
        "properties": {"type": {"const": "accepted"}, "ref": _REF, "id": {"type": "string"}},
    },
    "StreamOutputMessage": {
        "type": "object",
        "description": (
            "gateway -> client: one nbformat output as it is produced (a stream chunk arrives "
            "before the run ends). With `display_id`, `update: true` replaces the earlier "
            'display of that id. `{"output_type": "clear_output"}` clears what was shown. '
            "Live output stops at the run record's caps; the `done` record has the kept head "
            "and tail."
        ),
        "required": ["type", "ref", "id", "output"],
        "properties": {
            "type": {"const": "output"},
            "ref": _REF,
            "id": {"type": "string"},
            "output": {
                "anyOf": [
                    ref("Output"),
                    {
                        "type": "object",
                        "required": ["output_type"],
                        "properties": {"output_type": {"const": "clear_output"}},
                    },
                ]
            },
            "display_id": {"type": "string"},
            "update": {"const": True},
        },
    },
    "StreamOutputDroppedMessage": {
        "type": "object",
        "description": (
            "gateway -> client: this many live outputs of the run were skipped because the "
            "client read too slowly (the `done` record still has them, within its caps)."
        ),
        "required": ["type", "ref", "id", "dropped"],
        "properties": {
            "type": {"const": "output_dropped"},
            "ref": _REF,
            "id": {"type": "string"},
            "dropped": {"type": "integer", "minimum": 1},
        },
    },
    "StreamDoneMessage": {
        "type": "object",
        "description": "gateway -> client: the run ended; `run` is its full record.",
        "required": ["type", "ref", "id", "run"],
        "properties": {
            "type": {"const": "done"},
            "ref": _REF,
            "id": {"type": "string"},
            "run": ref("RunRecord"),
        },
    },
    "StreamErrorMessage": {
        "type": "object",
        "description": (
            "gateway -> client: a message was malformed or refused, with the codes of the "
            "HTTP errors (invalid_request, unsupported_language, not_found, capacity, ...). "
            "`ref` (null when the message had no valid one) and `id` are echoed; "
            "`retry_after` (seconds) comes with `capacity`. The connection stays open."
        ),
        "required": ["type", "ref", "error"],
        "properties": {
            "type": {"const": "error"},
            "ref": _REF,
            "id": {"type": "string"},
            "error": ref("ErrorBody"),
            "retry_after": {"type": "integer", "minimum": 1},
        },
    },
}

PATHS: dict[str, Schema] = {
    "/v1/stream": {
        "get": {
            "operationId": "stream",
            "tags": ["stream"],
            "summary": "WebSocket: run code and receive its output live",
            "description": (
                "Open a WebSocket here (the GET is the handshake). Authenticate with "
                "`Authorization: Bearer <token>` or, because browsers cannot set headers, "
                "with `?token=` (the only place a token is accepted in a URL; it is kept out "
                "of the access log). A browser's Origin must be the gateway's own or one the "
                "operator allowed (`allowed_origins`; `*` only with tokens), and "
                "`Sec-Fetch-Site: cross-site` without an allowed Origin is refused, else "
                "403; without tokens the page "
                "must also have been reached by a loopback name. A message nested more than "
                "`max_json_depth` levels deep gets an `invalid_request` error.\n\n"
                "One connection carries many runs. Every message is one JSON text frame "
                '(binary frames are refused). The client sends `{"type": "run", "ref": '
                '"<client id>", ...the fields of POST /v1/runs}`; the gateway answers, in '
                'order, for that `ref`: `{"type": "accepted", "ref", "id"}`, zero or more '
                '`{"type": "output", "ref", "id", "output": <nbformat output>}` as they are '
                'produced, then `{"type": "done", "ref", "id", "run": <run record>}`. '
                "Messages of concurrent runs interleave. The client may send "
                '`{"type": "cancel", "id"}`. A malformed or refused message gets `{"type": '
                '"error", "ref", "error": {code, message, field?}}` and the connection stays '
                "open. Output is rate- and size-capped exactly as in the run record; a client "
                "that reads too slowly gets `output_dropped` instead of some live outputs, "
                "and so does one whose output event would be larger than `max_event_bytes` "
                "(default 16 MiB). A `done` event is never dropped, but its record is cut to "
                "`max_event_bytes` like a record to `max_record_bytes` (a note says so; the "
                "whole record is at GET /v1/runs/{id}), and it waits while the client has "
                "not read what was sent before. A client that does not answer the gateway's "
                "pings (every 30 s) within 30 s is disconnected. Each user may keep "
                "`max_streams_per_user` (default 8) connections open; one more is 429 "
                "capacity with `Retry-After`. Closing the connection cancels its runs still "
                "in progress. The message schemas are listed in `x-websocket-messages`."
            ),
            "security": [{"bearer": []}, {"queryToken": []}],
            "parameters": [
                {
                    "name": "token",
                    "in": "query",
                    "required": False,
                    "description": "the bearer token, for browsers",
                    "schema": {"type": "string"},
                }
            ],
            "responses": {
                "101": {"description": "Switching to the WebSocket protocol."},
                **errors(400, 401, 403, 429),
            },
            "x-websocket-messages": {
                "client": [ref("StreamRunMessage"), ref("StreamCancelMessage")],
                "server": [
                    ref("StreamAcceptedMessage"),
                    ref("StreamOutputMessage"),
                    ref("StreamOutputDroppedMessage"),
                    ref("StreamDoneMessage"),
                    ref("StreamErrorMessage"),
                ],
            },
        }
    },
}
