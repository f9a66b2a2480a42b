"""The event definitions of the first-party processors: each names its payload version.

A change an old payload would not survive (a required field added, one
renamed) bumps ``version`` and adds the upcaster from the one before, so the
logs of every earlier release keep folding (docs/schema-evolution.md). The
tasks, DLQ and notification catalogs all build their definitions here.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from streamkit import EventDefinition, Upcaster

__all__ = ["definition"]


def definition(
    description: str,
    schema: type[BaseModel],
    *,
    version: int = 1,
    upcasters: Mapping[int, Upcaster] | None = None,
) -> EventDefinition:
    """The definition of one first-party event type, at ``version`` (1 until its shape changes)."""
    return EventDefinition(
        description=description,
        payload_schema=schema,
        version=version,
        upcasters=upcasters or {},
    )
