"""The event definitions of the first-party processors: each names its payload version.

A change an old payload would not survive (a required field added, one
renamed) bumps ``version`` and adds the upcaster from the one before, so the
logs of every earlier release keep folding (docs/schema-evolution.md). The
tasks, DLQ and notification catalogs all build their definitions here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from streamkit import EventDefinition, ProcessorContract, Upcaster

__all__ = ["definition", "named_input"]


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


def named_input(contract: ProcessorContract[Any], etype: str, body: BaseModel) -> dict[str, Any]:
    """The event input of ``body`` as ``etype``, naming the payload version ``body`` is of.

    The client helpers name it always: during a rolling deploy a host of the
    next release reads a named old payload through its upcasters, where an
    unnamed one would be taken for its current shape.
    """
    definition = contract.definition_for(etype)
    assert definition is not None, f"{contract.slug} defines no {etype}"
    return {
        "type": etype,
        "payload": body.model_dump(mode="json"),
        "payload_version": definition.version,
    }
