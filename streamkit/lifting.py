"""An event as a processor's contract reads it now: the read side of ``as=<slug>``.

:func:`as_read_by` gives a stored event in the shape a contract's current
code reads it, through the same definitions and upcasters the fold uses:
an event stored under a former name takes the current one, a payload of an
older version is lifted to the current version. Nothing is hidden: an event
the contract cannot read that way (its readers DROP it, no chain reaches it,
it is newer than the code, it does not validate) comes back as stored, with
a note saying why. Events of types the contract does not define come back
as they are, with no note.

Reads for people and tools (HTTP ``GET /v1/events?as=<slug>``,
``streamkit read --as SLUG``); a processor's own fold does not go through
here (it lifts with a plan per type, and counts what it skips).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from streamkit._event_builders import failure_text
from streamkit.contract import ProcessorContract
from streamkit.events import StreamEvent
from streamkit.upcasting import DROP, upcast

__all__ = ["as_read_by"]


def as_read_by(
    contract: ProcessorContract[Any], event: StreamEvent
) -> tuple[StreamEvent, dict[str, Any] | None]:
    """``(event as the contract reads it, note)``; see the module for the note's cases.

    The note is None for an event read as stored; ``{"from_type", "from_version"}``
    for one lifted; ``{"unreadable": why}`` for one returned as stored because the
    contract's code cannot read it.
    """
    stored_type = event.type
    current = contract.renames().get(stored_type, stored_type)
    definition = contract.definition_for(current)
    if definition is None:
        return event, None
    version = definition.version
    stored = event.payload_version
    if stored == version and current == stored_type:
        return event, None
    if stored > version:
        why = f"version {stored} is newer than this code, which knows version {version}"
        return event, {"unreadable": why}
    payload = {} if event.payload is None else event.payload
    try:
        lifted = upcast(current, payload, stored, version, definition.upcasters)
        if lifted is DROP:
            return event, {"unreadable": f"its readers drop version-{stored} events (DROP)"}
        definition.payload_schema.model_validate(lifted)
    except Exception as exc:
        return event, {"unreadable": failure_text(exc)}
    note = {"from_type": stored_type, "from_version": stored}
    return dataclasses.replace(event, type=current, payload=lifted, payload_version=version), note
