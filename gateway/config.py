"""A part's configuration: a frozen dataclass of exactly the settings that part reads, each
field named as its setting, so that `config_from` fills it from the settings (as a mapping:
`Settings.model_dump()`).

Only the composition root (`gateway.server`, `gateway.configure`) sees the whole
`Settings`; it builds each part's config once and passes it down, as jupyter_client hands a
kernel provisioner the config stanza of its kernel spec. The backends' (`DockerConfig`,
`LocalConfig`, `TenancyConfig`) are built by `gateway.sandbox.factory`; the rest by the
server (`ExecutionConfig`, `RunServiceConfig`, `RequestPolicy`, `UploadsConfig`,
`StoreConfig`, `FrontDoorConfig`). A value derived from several settings is a method of
the config that holds them.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

C = TypeVar("C")


def config_from(kind: type[C], settings: Mapping[str, Any]) -> C:
    """`kind` (a dataclass) filled from the settings: each field takes the setting of its
    name; a field whose type is itself a dataclass is filled the same way."""
    if not dataclasses.is_dataclass(kind):
        raise TypeError(f"{kind.__name__} is not a dataclass")
    hints = typing.get_type_hints(kind)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(kind):
        hint = hints[field.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            values[field.name] = config_from(hint, settings)
        elif field.name in settings:
            values[field.name] = settings[field.name]
        else:
            raise TypeError(f"{kind.__name__}.{field.name}: there is no setting of that name")
    return kind(**values)
