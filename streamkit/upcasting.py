"""Event payloads across versions: the chain from a stored version to the current one.

An :class:`~streamkit.EventDefinition` at ``version`` N names the payload
model of version N, the one a reduce sees, and ``upcasters``, a function
from each older version k to k + 1 over the payload's JSON dict. The old
model classes are not needed: an upcaster reads and returns plain JSON data.

Guarantees, checked when the definition is made (:func:`check_versions`,
each refusal an :class:`~streamkit.errors.InvalidContract` naming the key):

- ``version`` is an int from 1 to :data:`MAX_VERSION`;
- the upcasters' keys are ints from 1 to ``version - 1`` without a gap: a
  chain starts at the oldest version it can read and reaches ``version``;
- each upcaster is callable.

:func:`upcast` runs the chain from a stored version: one stored event stays
one event (never split in two), or is dropped when a step returns
:data:`DROP`. An upcaster is pure, as a reduce is (no clock, no I/O, the
same answer for the same payload) and returns JSON data; the chain is given
a copy of the stored payload, which every reader of the event shares. A
version newer than the definition, or older than its chain, is not guessed
at: :func:`upcast` refuses it with :class:`~streamkit.errors.InvalidEvent`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, final

from streamkit._json_diff import copy_form
from streamkit.errors import InvalidContract, InvalidEvent

__all__ = ["DROP", "MAX_VERSION", "Drop", "Upcaster", "check_versions", "upcast"]

MAX_VERSION: Final = 32_767
"""The highest payload version (what a SMALLINT column holds)."""


@final
class Drop:
    """The type of :data:`DROP` (compare with ``is DROP``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DROP"


DROP: Final = Drop()
"""What an upcaster returns for an event the current code no longer reads (a retired type)."""

Upcaster = Callable[[dict[str, Any]], "dict[str, Any] | Drop"]
"""A step from version k to k + 1: the version-k payload in, the version-(k+1) payload (or DROP) out."""


def check_versions(
    where: str, version: object, upcasters: object
) -> tuple[int, dict[int, Upcaster]]:
    """The checked ``(version, upcasters)`` of a definition; ``where`` names it in refusals."""
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise InvalidContract(
            f"{where}: version must be an int from 1 to {MAX_VERSION} (the version of its "
            f"payload_schema), got {version!r}",
            details={"field": "version", "value": repr(version)[:200]},
        )
    if not isinstance(upcasters, Mapping):
        raise InvalidContract(
            f"{where}: upcasters must map each older version to the function that lifts a "
            f"payload to the next version, got {type(upcasters).__name__}",
            details={"field": "upcasters"},
        )
    chain: dict[int, Upcaster] = {}
    for key, step in upcasters.items():
        if isinstance(key, bool) or not isinstance(key, int) or not 1 <= key < version:
            raise InvalidContract(
                f"{where}: upcasters has the key {key!r}, but a key is the version an upcaster "
                f"lifts from, an int from 1 to {version - 1} (version is {version}); raise "
                "version to the version of payload_schema",
                details={"field": "upcasters", "key": repr(key)[:200], "version": version},
            )
        if not callable(step):
            raise InvalidContract(
                f"{where}: upcasters[{key}] must be a function of the version-{key} payload "
                f"(a dict), got {step!r}",
                details={"field": "upcasters", "key": key},
            )
        chain[key] = step
    if chain:
        oldest = min(chain)
        missing = [k for k in range(oldest, version) if k not in chain]
        if missing:
            raise InvalidContract(
                f"{where}: the upcasters from version {oldest} to {version} miss the step from "
                f"{', '.join(map(str, missing))}; without it no payload older than "
                f"{missing[-1] + 1} reaches version {version}",
                details={"field": "upcasters", "missing": missing, "version": version},
            )
    return version, dict(sorted(chain.items()))


def upcast(
    event_type: str,
    payload: dict[str, Any],
    stored: int,
    version: int,
    upcasters: Mapping[int, Upcaster],
) -> dict[str, Any] | Drop:
    """The version-``version`` payload of a version-``stored`` one, or :data:`DROP`.

    Raises :class:`~streamkit.errors.InvalidEvent` when ``stored`` is newer
    than ``version`` or older than the chain reaches, and when a step
    returns something other than a dict or DROP.
    """
    if stored == version:
        return payload
    if stored > version:
        raise InvalidEvent(
            f'a "{event_type}" payload of version {stored} is newer than this code knows (version '
            f"{version}); it was not read",
            details={"type": event_type, "stored": stored, "version": version},
        )
    # The stored dict is shared (a read's page, every reader of the event): the chain gets
    # a copy, so a step that edits its argument in place changes nothing it does not own.
    current: dict[str, Any] = copy_form(payload)
    for step in range(stored, version):
        lift = upcasters.get(step)
        if lift is None:
            raise InvalidEvent(
                f'a "{event_type}" payload of version {stored} has no upcaster from version '
                f"{step}, so it cannot reach version {version}; it was not read",
                details={"type": event_type, "stored": stored, "version": version},
            )
        lifted = lift(current)
        if lifted is DROP:
            return DROP
        if not isinstance(lifted, dict):
            raise InvalidEvent(
                f'the upcaster of "{event_type}" from version {step} returned '
                f"{type(lifted).__name__}, not a dict or DROP; the event was not read",
                details={"type": event_type, "step": step},
            )
        current = lifted
    return current
