"""The one fold: which events a processor reduces, and how one event is reduced.

Shared by the engine's live path, its version re-reduce and
``streamkit.testing.reduce_processor``, so a replay can never disagree with the
live fold (a coercion applied live but not on replay would make a version bump
rewrite state). Also the state's JSON form for checkpoints, and the structured
reports of failures the engine swallows.

Events stored in an older shape are lifted here, and only here: an event of
a type renamed since (``renamed_from``) takes its current name, a payload of
an older version goes through its definition's upcasters (a step that
returns DROP drops the event, counted), so every path that folds (live,
catch-up, re-reduce, the test harness) reads old events alike. A payload of
a version newer than the code is never guessed at: the fold stops before it
(:attr:`Fold.stopped`), and the engine stalls there until newer code runs.
Events of the current version pay one comparison.

A payload that does not validate, and an event the reduce raises on, stop
the fold before that event the same way (``on_malformed`` and
``on_reduce_error`` are ``"stall"`` unless someone chose otherwise), so no
state the engine serves quietly omits an event. A processor that chose
``"skip"`` skips such an event instead, counted per stored (type, version)
with its first offsets. Every failure of user code here is logged with its
traceback, and its incident keeps a bounded excerpt of it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import Any, Final, Generic, TypeVar

import structlog
from pydantic import BaseModel

from streamkit._event_builders import failure_text, payload_validator, reshaped, with_payload
from streamkit.engine._incident_log import IncidentLog
from streamkit.engine._skip_tally import SkipTally
from streamkit.errors import PayloadMalformed, ReduceFailed, SchemaAhead, StreamkitError
from streamkit.events import StreamEvent
from streamkit.failure_policy import (
    OnMalformed,
    OnReduceError,
    check_on_malformed,
    check_on_reduce_error,
    failure_choice,
)
from streamkit.live_state import LIVE_STATE_CHANGED
from streamkit.processor import USER_EXITS, StreamProcessor, consumes_predicate, exit_refused
from streamkit.tracebacks import traceback_excerpt
from streamkit.upcasting import DROP, Upcaster, upcast

__all__ = ["MAX_SLICE", "SLICE_SECONDS", "Fold", "report"]

SLICE_SECONDS = 0.05
"""How long one slice of a paced fold aims to hold the event loop (see Fold.fold_paced)."""

MAX_SLICE = 4096
"""The most events one slice folds: a whole catch-up page of a fast reduce."""

S = TypeVar("S")

_Validate = Callable[[Any], BaseModel]


class _Skip(Enum):
    IGNORED = "ignored"
    """The plan of a type whose durable events this processor does not reduce."""


_IGNORED: Final = _Skip.IGNORED

_Plan = tuple[type[BaseModel], _Validate, int, str | None, Mapping[int, Upcaster]] | _Skip | None
"""Per stored type: its model, the model's validate function, the model's version, the
type's current name if it was renamed (else None) and its upcasters; None for an
undeclared type."""

_GONE: Final = object()
"""What lifting gives for an event the fold does not reduce (dropped, unreadable or ahead)."""

_log = structlog.get_logger("streamkit.engine")


def report(what: str, exc: BaseException | None, *, slug: str, **fields: Any) -> None:
    """Report a failure the engine swallows (it keeps running), as one structured log line.

    The line carries the exception's traceback (``exc_info``): the host's JSON
    log renders it as structured frames, so a failure of user code is never
    only ``Type: message``.
    """
    if exc is None:
        _log.warning(what, slug=slug, error=None, **fields)
    else:
        _log.warning(what, slug=slug, error=repr(exc), exc_info=exc, **fields)


_NEVER_REDUCED = frozenset({LIVE_STATE_CHANGED})
"""A live-state delta is never reduced or reacted to, whatever ``consumes`` says: it is
a notification about state, and folding it back in would loop."""


class Fold(Generic[S]):
    """Validate, normalize and reduce events for one processor, never raising.

    :meth:`apply` folds one event and returns the next state and the event as
    the hooks must see it (its payload the validated model when the type is
    declared), or ``None`` for the event when its payload is malformed: such an
    event is skipped for the reduce AND the effects, and reported (or, with
    ``on_malformed="stall"``, the default, the fold stops before it:
    :attr:`stopped`). A reduce that raises stops the fold before its event
    the same way, or, with ``on_reduce_error="skip"``, keeps the previous
    state and is reported. :meth:`fold_all` is the fold itself, over many events with no
    effects to run (catch-up, re-reduce, the test harness); :meth:`apply` is
    it over one.
    """

    __slots__ = (
        "_contract",
        "_incidents",
        "_on_error",
        "_on_malformed",
        "_on_reduce_error",
        "_plans",
        "_reduce",
        "_renames",
        "_slice",
        "_slug",
        "reduces",
        "stopped",
        "tally",
    )

    def __init__(
        self,
        processor: StreamProcessor[S],
        *,
        on_error: Callable[[BaseException], None] | None = None,
        on_malformed: OnMalformed | None = None,
        on_reduce_error: OnReduceError | None = None,
    ) -> None:
        contract = processor.contract
        self._contract = contract
        self._on_error = on_error
        # The host's word on this processor, else its contract's, else stall.
        where = f'processor "{contract.slug}"'
        self._on_malformed = failure_choice(
            check_on_malformed(where, on_malformed), contract.on_malformed
        )
        self._on_reduce_error = failure_choice(
            check_on_reduce_error(where, on_reduce_error), contract.on_reduce_error
        )
        self._slug = contract.slug
        self._reduce = processor.reduce
        # Per event type, filled on first sight: its payload model and that
        # model's validate function, None for an undeclared type, or _IGNORED.
        self._plans: dict[str, _Plan] = {}
        # How many events one slice of a paced fold takes: learned from the last
        # slice's time per event, so a slice lasts about SLICE_SECONDS.
        self._slice = 8
        self._renames = contract.renames()
        self.reduces = _reduces(contract.consumes, self._renames)
        # What operators see in `streamkit status`, and what the checkpoint keeps: every
        # skipped or dropped event, counted once.
        self.tally = SkipTally()
        # Skipped events (under "skip") are logged one line per kind per interval.
        self._incidents = IncidentLog(self._report_skipped)
        # Why the fold stopped before an event (a payload newer than the code, one
        # that does not validate, or a reduce that raised, under "stall"); nothing
        # after it is folded by this fold.
        self.stopped: StreamkitError | None = None

    @property
    def on_malformed(self) -> OnMalformed:
        """What this fold does at a payload that does not validate (as chosen)."""
        return self._on_malformed

    @property
    def on_reduce_error(self) -> OnReduceError:
        """What this fold does at an event its reduce raises on (as chosen)."""
        return self._on_reduce_error

    def payload_types(self) -> dict[str, type[BaseModel]]:
        """The payload model of each durable type this processor reduces: what a typed read types."""
        contract = self._contract
        consumes = contract.consumes
        # A versioned type is validated here, after its events are lifted: a read types
        # only the types whose every readable event is of the model's own shape.
        schemas = {
            t: s
            for t, s in contract.payload_schemas().items()
            if contract.payload_version_of(t) == 1
        }
        if consumes is None or "*" in consumes:
            return {t: s for t, s in schemas.items() if t not in _NEVER_REDUCED}
        return {t: s for t, s in schemas.items() if t in consumes}

    def _plan_for(self, event: StreamEvent) -> _Plan:
        """How events of ``event``'s type are folded: the cache :meth:`fold_all` reads first.

        A durable event's fate depends on its type alone (``consumes``), so it
        is cached per type; an ephemeral one is reduced only if its type is
        named, which the fold asks each time. One reduced as ephemeral would
        be reduced as durable too, so its plan holds for both.
        """
        etype = event.type
        if not self.reduces(event):
            if not event.ephemeral:
                self._plans[etype] = _IGNORED
            return _IGNORED
        renamed = self._renames.get(etype)
        definition = self._contract.definition_for(renamed or etype)
        plan: _Plan = None
        if definition is not None:
            schema = definition.payload_schema
            validate = payload_validator(schema)
            plan = (schema, validate, definition.version, renamed, definition.upcasters)
        self._plans[etype] = plan
        return plan

    async def fold_paced(self, events: Sequence[StreamEvent], state: S) -> tuple[S, int]:
        """:meth:`fold_all`, in slices of about :data:`SLICE_SECONDS`, yielding to the loop between.

        A page of up to 4,000 events whose reduce is slow (CPU work, a large
        state copied per event) would otherwise hold the event loop for
        seconds: the host's status, /healthz and every other processor wait.
        A fast reduce folds a page in one slice, so the catch-up's hot path
        pays a clock reading per slice, not per event.
        """
        total = len(events)
        remaining = iter(events)
        done = folded_total = 0
        while done < total:
            size = min(self._slice, total - done)
            began = time.perf_counter()
            state, folded = self.fold_all(itertools.islice(remaining, size), state)
            self._learn(size, time.perf_counter() - began)
            done += size
            folded_total += folded
            if done < total:
                await asyncio.sleep(0)
        return state, folded_total

    def _learn(self, events: int, seconds: float) -> None:
        if events <= 0:
            return
        if seconds <= 0:
            self._slice = MAX_SLICE
            return
        self._slice = max(1, min(MAX_SLICE, int(SLICE_SECONDS * events / seconds)))

    def apply(self, event: StreamEvent, state: S) -> tuple[S, StreamEvent | None]:
        """Fold one event into ``state``; see the class docstring."""
        seen: list[StreamEvent] = []
        state, _ = self.fold_all((event,), state, seen)
        return state, seen[0] if seen else None

    def fold_all(
        self,
        events: Iterable[StreamEvent],
        state: S,
        seen: list[StreamEvent] | None = None,
    ) -> tuple[S, int]:
        """Fold every event this processor reduces; return the state and how many were folded.

        The one fold, in one loop (the catch-up's hot path): validation
        inline, a malformed payload skipped and reported, a reduce that raises
        reported with the state kept. ``seen`` collects each folded event as
        the hooks must see it (what :meth:`apply` returns).
        """
        reduces = self.reduces
        plans = self._plans
        reduce = self._reduce
        folded = 0
        if self.stopped is not None:
            return state, folded
        for event in events:
            etype = event.type
            try:
                plan = plans[etype]
            except KeyError:
                plan = self._plan_for(event)
            if plan is _IGNORED or (event.ephemeral and not reduces(event)):
                continue
            if plan is not None:
                schema, validate, version, renamed, upcasters = plan
                payload = event.payload
                if event.payload_version != version or renamed is not None:
                    # An old event: lifted, validated, then built once in its new shape.
                    payload = self._lift(event, version, renamed or etype, upcasters)
                    if payload is _GONE:
                        if self.stopped is not None:
                            break  # nothing past it is folded: the engine stalls here
                        continue
                    try:
                        model = validate(payload)
                    except Exception as exc:
                        if self._malformed(event, exc):
                            break
                        continue
                    event = reshaped(event, renamed or etype, model, version)
                elif type(payload) is not schema:
                    try:
                        # An absent payload is ``{}``, the same convention the log uses.
                        model = validate({} if payload is None else payload)
                    except Exception as exc:
                        if self._malformed(event, exc):
                            break
                        continue
                    event = with_payload(event, model)
            try:
                next_state = reduce(event, state)
            except Exception as exc:
                if self._reduce_failed(event, exc):
                    break  # stalled before it: neither folded nor seen
                next_state = None
            except USER_EXITS as exc:
                if self._reduce_failed(event, exit_refused(exc, "reduce")):
                    break
                next_state = None
            folded += 1
            if seen is not None:
                seen.append(event)
            if next_state is not None:
                state = next_state
        return state, folded

    def _report_skipped(self, exc: BaseException, *, what: str, **fields: Any) -> None:
        report(what, exc, slug=self._slug, **fields)

    @property
    def stopped_at(self) -> int | None:
        """The offset of the event the fold stopped before, or None."""
        stopped = self.stopped
        return None if stopped is None else int(stopped.details["offset"])

    def raise_if_stopped(self) -> None:
        """Raise why the fold stopped (a fresh error of the same class), if it did."""
        stopped = self.stopped
        if stopped is not None:
            raise type(stopped)(stopped.message, details=stopped.details)

    def _lift(
        self, event: StreamEvent, version: int, etype: str, upcasters: Mapping[int, Upcaster]
    ) -> Any:
        """``event``'s payload in the current shape; :data:`_GONE` if dropped, unreadable or ahead."""
        stored = event.payload_version
        if stored > version:
            self.stopped = SchemaAhead(
                f'processor "{self._slug}" stopped before offset {event.offset}: its "{etype}" '
                f"payload is of version {stored}, and this code knows version {version} at "
                "most; nothing was skipped; run the processor where its newer code is deployed",
                details={
                    "slug": self._slug,
                    "offset": event.offset,
                    "type": etype,
                    "stored": stored,
                    "version": version,
                },
            )
            return _GONE
        payload = {} if event.payload is None else event.payload
        if stored == version:
            return payload  # renamed only
        try:
            lifted = upcast(etype, payload, stored, version, upcasters)
        except Exception as exc:
            self._malformed(event, exc)  # skipped, or the fold stops here
            return _GONE
        if lifted is DROP:
            self.tally.drop(event.offset)
            return _GONE
        return lifted

    def _malformed(self, event: StreamEvent, exc: Exception) -> bool:
        """Skip ``event`` (counted), or stop the fold before it; True if it stopped."""
        if self._on_error is not None:
            self._on_error(exc)
        stall = self._on_malformed == "stall"
        if not stall:
            self._incidents.skipped(
                ("malformed", event.type, event.payload_version),
                event.offset,
                exc,
                what="processor.payload_malformed",
                type=event.type,
                version=event.payload_version,
            )
        else:
            report(
                "processor.payload_malformed",
                exc,
                slug=self._slug,
                offset=event.offset,
                type=event.type,
                version=event.payload_version,
                detail="the processor stalls before it",
            )
            self.stopped = PayloadMalformed(
                f'processor "{self._slug}" stopped before offset {event.offset}: its '
                f'"{event.type}" payload (version {event.payload_version}) does not validate '
                f'({failure_text(exc)}); on_malformed is "stall", so nothing was skipped; '
                "deploy code that reads it (a model or an upcaster), or run `streamkit skip "
                f"{self._slug} --offset {event.offset}` to move past it",
                details={
                    "slug": self._slug,
                    "offset": event.offset,
                    "type": event.type,
                    "version": event.payload_version,
                    "error": failure_text(exc),
                },
            )
            return True
        self.tally.malformed_payload(
            event.offset, event.type, event.payload_version, _incident(event, exc)
        )
        return False

    def _reduce_failed(self, event: StreamEvent, exc: Exception) -> bool:
        """Skip ``event`` (counted, the state kept), or stop the fold before it; True if it stopped."""
        if self._on_error is not None:
            self._on_error(exc)
        stall = self._on_reduce_error == "stall"
        if not stall:
            self._incidents.skipped(
                ("reduce", event.type),
                event.offset,
                exc,
                what="processor.reduce_failed",
                type=event.type,
            )
        else:
            report(
                "processor.reduce_failed",
                exc,
                slug=self._slug,
                offset=event.offset,
                type=event.type,
                detail="the processor stalls before it",
            )
            self.stopped = ReduceFailed(
                f'processor "{self._slug}" stopped before offset {event.offset}: its reduce '
                f'raised on the "{event.type}" event ({type(exc).__name__}: '
                f'{failure_text(exc)}); on_reduce_error is "stall", so nothing was skipped and '
                "the state it serves omits no event; deploy a reduce that reads it, or run "
                f"`streamkit skip {self._slug} --offset {event.offset}` to move past it",
                details={
                    "slug": self._slug,
                    "offset": event.offset,
                    "type": event.type,
                    "error": f"{type(exc).__name__}: {failure_text(exc)}",
                    "traceback": traceback_excerpt(exc),
                },
            )
            return True
        self.tally.reduce_failure(event.offset, event.type, _incident(event, exc))
        return False


def _reduces(
    consumes: Sequence[str] | None, renames: dict[str, str]
) -> Callable[[StreamEvent], bool]:
    """The consumes rule, reading an event stored under an old name as its current type."""
    rule = consumes_predicate(consumes, never=_NEVER_REDUCED)
    if not renames:
        return rule

    def reduces(event: StreamEvent) -> bool:
        current = renames.get(event.type)
        if current is None:
            return rule(event)
        return rule(
            StreamEvent(
                path=event.path, offset=event.offset, type=current, ephemeral=event.ephemeral
            )
        )

    return reduces


def _incident(event: StreamEvent, exc: Exception) -> dict[str, Any]:
    # `error` is one line: `status` prints it on the processor's line; the excerpt is for
    # `status --json` and the admin page.
    error = f"{type(exc).__name__}: {failure_text(exc)}"
    return {
        "offset": event.offset,
        "type": event.type,
        "error": error,
        "traceback": traceback_excerpt(exc),
    }
