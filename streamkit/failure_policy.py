"""What a processor does at an event it cannot fold: stall (the default), or skip it.

Two words of a processor's, ``on_malformed`` (a stored payload its models
cannot read) and ``on_reduce_error`` (an event its reduce raises on), each
``"skip"`` or ``"stall"``. They may be said in three places, and
:func:`failure_choice` is the one rule that reads them: the host's word on
the processor, the contract's, the host's default for every processor, else
``"stall"``, so that no state served ever quietly omits an event unless
someone chose that.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from streamkit.errors import InvalidContract

__all__ = [
    "DEFAULT_ON_FAILURE",
    "OnMalformed",
    "OnReduceError",
    "check_on_malformed",
    "check_on_reduce_error",
    "failure_choice",
]

OnMalformed = Literal["skip", "stall"]
"""What a processor does at a stored payload its models cannot read: skip it
(counted per type and version) or stall before it until new code or an
operator's skip moves it on."""

OnReduceError = Literal["skip", "stall"]
"""What a processor does at an event its reduce raises on: skip it (the state
keeps what it was before the event, counted) or stall before it until new code
or an operator's skip moves it on."""

DEFAULT_ON_FAILURE: Final[Literal["stall"]] = "stall"
"""What a processor does at an event it cannot fold when nobody chose: stall, so
that no state served ever quietly omits an event (skipping is a choice)."""


def failure_choice(
    said: str | None, contract_said: str | None, host_default: str | None = None
) -> Literal["skip", "stall"]:
    """The one rule for ``on_malformed`` and ``on_reduce_error``: the first word said.

    In order: the host's word on this processor (its ``[[processors]]``
    entry, or the engine's argument), the contract's, the host's default for
    every processor (the top-level key of ``streamkit.toml``), else
    :data:`DEFAULT_ON_FAILURE`. A contract's explicit choice beats a
    host-wide default because its author knew what the processor serves.
    """
    for word in (said, contract_said, host_default):
        if word == "skip":
            return "skip"
        if word == "stall":
            return "stall"
    return DEFAULT_ON_FAILURE


def check_on_malformed(where: str, value: object) -> OnMalformed | None:
    """``value`` if it is None or an :data:`OnMalformed` choice, else :class:`InvalidContract`."""
    return _check_failure_word(where, "on_malformed", value)


def check_on_reduce_error(where: str, value: object) -> OnReduceError | None:
    """``value`` if it is None or an :data:`OnReduceError` choice, else :class:`InvalidContract`."""
    return _check_failure_word(where, "on_reduce_error", value)


def _check_failure_word(where: str, name: str, value: object) -> Literal["skip", "stall"] | None:
    if value is None or value == "skip" or value == "stall":
        return value
    choices = " or ".join(f'"{c}"' for c in get_args(OnMalformed))
    raise InvalidContract(
        f"{where}: {name} must be {choices} (or None: the host's default, else stall), "
        f"got {value!r}",
        details={"field": name, "value": repr(value)[:200]},
    )
