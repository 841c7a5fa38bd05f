"""`FrontDoorConfig`: the settings the handlers read, and no other: how much of the clients'
bytes the gateway holds at once, how long a client has to take an answer, which origins may
call it, how many WebSocket connections a user keeps; with the operator's policy that every
parsed body is put under (`RequestPolicy`). Each field is the setting of its name
(`gateway.config.config_from`).
"""

from __future__ import annotations

import dataclasses

from gateway.runs.config import RequestPolicy


@dataclasses.dataclass(frozen=True)
class FrontDoorConfig:
    # request bodies and WebSocket messages
    max_body_bytes: int
    max_body_bytes_in_flight: int
    max_body_bytes_in_flight_per_user: int
    max_upload_bytes: int  # the body of POST /v1/uploads
    # answers and WebSocket events
    max_answer_bytes_in_flight: int
    max_answer_bytes_in_flight_per_user: int
    write_timeout: float
    max_event_bytes: int
    # who may call, and how much at once
    allowed_origins: tuple[str, ...]
    max_streams_per_user: int
    policy: RequestPolicy
