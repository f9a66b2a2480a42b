"""The schedules processor: each slot of each schedule fired once, or on record as missed.

At every at-head pass (a wakeup it asked for, or any event it consumes)
:class:`SchedulesProcessor` decides each schedule from *now*
(:func:`~._timing.due`, from the schedule's ``through`` to the clock): the
slots that fire append ``schedule.fired`` and the ``task.requested`` it
stands for, in one commit; the slots that do not append one
``schedule.missed`` per run, with the reason (outside the catch-up window,
coalesced, over ``max_runs``, paused). Then it asks to be woken at the
earliest next firing instant (slot plus jitter).

Once per slot, by two guards that do not depend on each other:

- The host runs the processor under its lease: one host decides at a time,
  and a host that lost the lease appends nothing (its appends are fenced).
- Every event a slot makes has an idempotency key built from the schedule
  and the slot (``schedules/fired/<name>/<slot>``, the task id
  ``sched/<name>/<slot>``), and its body is a function of the definition
  and the slot: a decision made again after a crash, on any host, appends
  nothing new, and the tasks processor runs the task once.

A schedule's ``through`` moves only when its fired and missed events are
reduced, so a decision that never reached the log is made again. Slots
sent by this incarnation but not reduced yet are remembered so a second
pass does not send them again.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog
from streamkit.processors.schedules._events import (
    LATENESS_KEPT,
    MAX_BACKFILL,
    SCHEDULE_BACKFILLED,
    SCHEDULE_DELETED,
    SCHEDULE_FIRED,
    SCHEDULE_MISSED,
    SCHEDULES_CONTRACT,
    TASK_SETTLED,
    ScheduleBackfilled,
    ScheduleBackfillRequested,
    ScheduleBuffered,
    ScheduleDefined,
    ScheduleDeleted,
    ScheduleEntry,
    ScheduleFired,
    ScheduleMissed,
    SchedulePaused,
    ScheduleResumed,
    SchedulesState,
)
from streamkit.processors.schedules._schedule import (
    AppendEvent,
    Schedule,
    schedule_of,
)
from streamkit.processors.schedules._slot_events import (
    buffered_event,
    cancel_event,
    fired_events,
    instant,
    missed_event,
    missed_runs,
    seconds,
    task_id_of,
)
from streamkit.processors.schedules._timing import Catchup, Missed, MissedReason, due, jitter

from streamkit import (
    IdempotencyConflict,
    InvalidContract,
    ProcessEventArgs,
    ProcessorContract,
    StreamEvent,
    StreamkitError,
    StreamProcessor,
    define_processor_contract,
)

__all__ = ["SchedulesProcessor"]

_log = structlog.get_logger("streamkit.schedules")


_PIECE = 100
"""Slots a backfill fires per append (each slot's events keyed by the slot)."""


async def _fire_each(
    args: ProcessEventArgs[SchedulesState], schedule: Schedule, slots: Sequence[datetime]
) -> tuple[int, str | None]:
    """Fire ``slots``: ``(kept, why)``, the slots that had fired already, and why it stopped.

    A piece of slots is one append; a piece refused (a key that names an earlier
    firing with another body: the schedule was redefined since) is sent slot by
    slot, so the slots that fired keep their first firing and the others fire. A
    refusal that cannot change stops the backfill (``why``); one that may
    (storage busy, lease lost) is raised: the batch is retried.
    """
    kept = 0
    for start in range(0, len(slots), _PIECE):
        piece = slots[start : start + _PIECE]
        try:
            await args.append(*(e for slot in piece for e in fired_events(schedule, slot)))
            continue
        except StreamkitError as exc:
            if exc.retryable:
                raise
        # One slot of the piece was refused (an earlier firing's key, say): slot by slot.
        for slot in piece:
            try:
                await args.append(*fired_events(schedule, slot))
            except IdempotencyConflict:
                kept += 1
            except StreamkitError as exc:
                if exc.retryable:
                    raise
                return kept, f"slot {slot.isoformat()} was refused: {exc.message}"
    return kept, None


def _created_seconds(event: StreamEvent) -> float | None:
    try:
        return datetime.fromisoformat(event.created_at).timestamp() if event.created_at else None
    except ValueError:
        return None


def _contract_of(item: ProcessorContract[Any] | str) -> ProcessorContract[Any]:
    """A contract, or the one a ``"module:NAME"`` string names (what streamkit.toml can give)."""
    if isinstance(item, ProcessorContract):
        return item
    module, _, attr = str(item).partition(":")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidContract(
            f"SchedulesProcessor emits: cannot import {item!r} ({exc}); name a processor "
            'contract as "module:NAME"; nothing was built',
            details={"emits": str(item)},
        ) from exc
    if not isinstance(found, ProcessorContract):
        raise InvalidContract(
            f"SchedulesProcessor emits: {item!r} is a {type(found).__name__}, not a processor "
            "contract; nothing was built",
            details={"emits": str(item)},
        )
    return found


class SchedulesProcessor(StreamProcessor[SchedulesState]):
    """Fires the slots of the schedules defined on its stream (see the module).

    ``clock`` gives epoch seconds (the engine's clock when None): the instant
    every decision is made from. ``emits`` lists the contracts (or
    ``"module:NAME"`` strings) whose events :class:`AppendEvent` schedules may
    append.
    """

    contract = SCHEDULES_CONTRACT

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        emits: Sequence[ProcessorContract[Any] | str] = (),
    ) -> None:
        self._clock = clock
        if emits:
            # The events AppendEvent schedules may append: those the given contracts define.
            base = SCHEDULES_CONTRACT
            known = {dep.slug for dep in base.processor_deps}
            given = [_contract_of(item) for item in emits]
            deps = [d for d in given if d.slug not in known]
            self.contract = define_processor_contract(
                slug=base.slug,
                version=base.version,
                description=base.description,
                state_schema=SchedulesState,
                events=base.events,
                consumes=list(base.consumes or ()),
                processor_deps=[*base.processor_deps, *deps],
                emits=[
                    *base.emits,
                    *(t for dep in given for t in (dep.events or {}) if t not in base.emits),
                ],
            )
        # Per schedule, the newest instant this incarnation sent a decision
        # through that the state has not reduced yet.
        self._sent: dict[str, float] = {}
        # Per schedule, the backfill request this incarnation sent the slots of.
        self._backfilling: dict[str, int] = {}
        # Definitions read back from the log, by the payload they came from.
        self._built: dict[str, tuple[ScheduleDefined, Schedule | None]] = {}

    def status_summary(self, state: SchedulesState) -> Mapping[str, Any] | None:
        """``{schedules, paused, fired, missed}``: what ``status`` shows beside the row."""
        entries = state.schedules.values()
        return {
            "schedules": len(state.schedules),
            "paused": sum(1 for e in entries if e.paused),
            "fired": sum(e.fired for e in entries),
            "missed": sum(e.missed for e in entries),
        }

    # -- reduce ---------------------------------------------------------------------------

    def reduce(self, event: StreamEvent, state: SchedulesState) -> SchedulesState | None:
        p = event.payload
        entries = state.schedules
        if isinstance(p, ScheduleDefined):
            old = entries.get(p.name)
            if old is None:
                entry = ScheduleEntry(definition=p, through=p.defined_at)
            else:
                entry = old.model_copy(update={"definition": p})
            return SchedulesState(schedules={**entries, p.name: entry})
        if event.type in TASK_SETTLED:
            return self._settled(p, entries)
        old = entries.get(getattr(p, "name", ""))
        if old is None:
            return None  # of a schedule deleted or never defined: nothing to change
        if isinstance(p, ScheduleFired):
            fired_at = _created_seconds(event)
            lateness = old.lateness
            backfill = old.backfill
            backfilled = backfill is not None and backfill[0] <= p.slot <= backfill[1]
            if fired_at is not None and not backfilled:  # a backfill's lateness is its age
                late = round(max(0.0, fired_at - p.fire_at), 3)
                lateness = [*lateness[-(LATENESS_KEPT - 1) :], late]
            entry = old.model_copy(
                update={
                    "through": max(old.through, p.slot),
                    "fired": old.fired + 1,
                    "last_slot": max(old.last_slot or p.slot, p.slot),
                    "last_fired_at": fired_at or old.last_fired_at,
                    "lateness": lateness,
                    "running": [*old.running, p.task_id] if p.task_id else old.running,
                    "buffered": [b for b in old.buffered if b != p.slot],
                }
            )
        elif isinstance(p, ScheduleBackfillRequested):
            entry = old.model_copy(update={"backfill": [p.first, p.last, float(event.offset)]})
        elif isinstance(p, ScheduleBackfilled):
            if old.backfill is None or int(old.backfill[2]) != p.request_offset:
                return None
            entry = old.model_copy(update={"backfill": None})
        elif isinstance(p, ScheduleBuffered):
            if p.slot in old.buffered:
                return None
            entry = old.model_copy(
                update={"through": max(old.through, p.slot), "buffered": [*old.buffered, p.slot]}
            )
        elif isinstance(p, ScheduleMissed):
            missed_by = {**old.missed_by, p.reason: old.missed_by.get(p.reason, 0) + p.count}
            entry = old.model_copy(
                update={
                    "through": max(old.through, p.last),
                    "missed": old.missed + p.count,
                    "missed_by": missed_by,
                }
            )
        elif isinstance(p, SchedulePaused):
            if old.paused:
                return None
            entry = old.model_copy(update={"paused": True, "paused_at": p.at})
        elif isinstance(p, ScheduleResumed):
            if not old.paused:
                return None
            entry = old.model_copy(update={"paused": False, "resumed_at": p.at})
        elif isinstance(p, ScheduleDeleted):
            return SchedulesState(schedules={n: e for n, e in entries.items() if n != p.name})
        else:
            return None
        return SchedulesState(schedules={**entries, p.name: entry})

    @staticmethod
    def _settled(payload: Any, entries: dict[str, ScheduleEntry]) -> SchedulesState | None:
        """A task settled: if a slot of a schedule requested it, it runs no more."""
        task_id = (
            payload.get("task_id")
            if isinstance(payload, dict)
            else getattr(payload, "task_id", None)
        )
        if not isinstance(task_id, str) or not task_id.startswith("sched/"):
            return None
        name = task_id.split("/", 2)[1]
        old = entries.get(name)
        if old is None or task_id not in old.running:
            return None
        entry = old.model_copy(update={"running": [t for t in old.running if t != task_id]})
        return SchedulesState(schedules={**entries, name: entry})

    # -- the at-head pass: decide from now ------------------------------------------------

    def process_event(self, args: ProcessEventArgs[SchedulesState]) -> None:
        event = args.event
        if event is not None and event.type == SCHEDULE_DELETED:
            self._deleted(args, event)
        if not args.delivery.caught_up:
            return
        now = self._now(args)
        state = args.state
        for name in [n for n in self._sent if n not in state.schedules]:
            del self._sent[name]
        wake: float | None = None
        for entry in state.schedules.values():
            schedule = self._schedule(entry)
            if schedule is None:
                continue  # refused when read back: reported once, never fired
            if entry.backfill is not None:
                self._backfill(args, schedule, entry)
            next_at = self._decide(args, schedule, entry, now)
            if next_at is not None and (wake is None or next_at < wake):
                wake = next_at
        if wake is not None:
            args.schedule_wakeup(wake)

    def _deleted(self, args: ProcessEventArgs[SchedulesState], event: StreamEvent) -> None:
        """A schedule was deleted: its slots that came due undecided are put on record.

        They are missed for ``paused`` if it was paused, else for
        ``deleted`` (they came due while no host decided, and no pass will).
        """
        name = getattr(event.payload, "name", None)
        old = args.previous_state.schedules.get(name) if isinstance(name, str) else None
        if old is None or name is None:
            return
        schedule = self._schedule(old)
        sent = self._sent.pop(name, None)
        if schedule is None:
            return
        at = _created_seconds(event) or self._now(args)
        after = instant(max(old.through, sent or old.through))
        decided = due(schedule.timing, Catchup("all", window=timedelta(0)), after, instant(at))
        reason: MissedReason = "paused" if old.paused else "deleted"
        if decided.missed:
            args.append(*(missed_event(name, m, reason) for m in decided.missed))

    def _backfill(
        self, args: ProcessEventArgs[SchedulesState], schedule: Schedule, entry: ScheduleEntry
    ) -> None:
        """Fire the slots of a backfill range that are decided already, then say it is done.

        Whatever runs (overlap does not apply): the operator asked for these
        slots. A slot that fired before keeps its first firing (its keys),
        whatever the definition says now: it is counted ``kept``. At most
        :data:`MAX_BACKFILL` slots; a larger range is refused whole. A slot
        refused for another reason that will not change ends the backfill,
        ``refused`` with the reason, instead of retrying it for ever.
        """
        assert entry.backfill is not None
        first, last, at = entry.backfill
        request = int(at)
        if self._backfilling.get(schedule.name) == request:
            return  # sent by this incarnation; its done event is on the way
        end = instant(min(last, entry.through))
        slots: list[datetime] = []
        for slot in schedule.timing.forward(instant(first) - timedelta(seconds=1)):
            if slot > end or len(slots) > MAX_BACKFILL:
                break
            slots.append(slot)
        refused = None
        undeclared = self._undeclared(schedule)
        if undeclared is not None:
            refused = f"this processor may not append {undeclared!r} events; none was fired"
            slots = []
        elif len(slots) > MAX_BACKFILL:
            refused = f"the range holds more than {MAX_BACKFILL} slots; none was fired"
            slots = []
        self._backfilling[schedule.name] = request
        name = schedule.name

        async def fire() -> None:
            try:
                kept, why = await _fire_each(args, schedule, slots)
            except BaseException:
                self._backfilling.pop(name, None)  # the batch is retried: send it again
                raise
            body = ScheduleBackfilled(
                name=name,
                request_offset=request,
                slots=len(slots) if why is None else 0,
                kept=kept,
                refused=refused or why,
            )
            await args.append(
                {
                    "type": SCHEDULE_BACKFILLED,
                    "payload": body.model_dump(mode="json"),
                    "idempotency_key": f"schedules/backfilled/{name}/{request}",
                }
            )

        # A blocker: the cursor waits for the slots and the done event, so a crash
        # sends the backfill again (each slot keyed: nothing fires twice).
        args.block_processor_while(fire)

    def _now(self, args: ProcessEventArgs[SchedulesState]) -> float:
        return self._clock() if self._clock is not None else args.now()

    def _decide(
        self,
        args: ProcessEventArgs[SchedulesState],
        schedule: Schedule,
        entry: ScheduleEntry,
        now: float,
    ) -> float | None:
        """Append what is due for one schedule; the instant it next needs a pass (None: never)."""
        name = schedule.name
        sent = self._sent.get(name)
        if sent is not None and sent <= entry.through:
            del self._sent[name]
            sent = None
        after = instant(max(entry.through, sent or entry.through))
        clock = instant(now)
        events: list[dict[str, Any]] = []
        through = after
        if entry.paused:
            # The slots of a pause are put on record at any pass meanwhile (no wakeup
            # is asked for them), and at the resume or the deletion.
            decided = due(schedule.timing, Catchup("all", window=timedelta(0)), after, clock)
            events += [missed_event(name, m, "paused") for m in decided.missed]
            through = clock
        else:
            resumed = entry.resumed_at
            if resumed is not None and instant(resumed) > after:
                paused = due(
                    schedule.timing, Catchup("all", window=timedelta(0)), after, instant(resumed)
                )
                events += [missed_event(name, m, "paused") for m in paused.missed]
                after = through = instant(resumed)
            decided = due(schedule.timing, schedule.catchup, after, clock)
            events += [missed_event(name, m) for m in decided.missed]
            for missed in decided.missed:
                through = max(through, missed.last)
            fired, through = self._overlap(schedule, entry, decided.fire, clock, through)
            events += fired
        if events:
            marked = self._sent[name] = seconds(through)
            appended = self._append_or_record(args, name, events)

            def unsent(done: Any) -> None:
                # Not in the log: the next pass decides again (the keys keep it single).
                if (done.cancelled() or done.exception() is not None) and (
                    self._sent.get(name) == marked
                ):
                    del self._sent[name]

            appended.add_done_callback(unsent)
        if entry.paused:
            return None
        for slot in schedule.timing.forward(through):
            return seconds(slot + jitter(name, slot, schedule.jitter))
        return None

    def _append_or_record(
        self, args: ProcessEventArgs[SchedulesState], name: str, events: list[dict[str, Any]]
    ) -> Any:
        """Append one schedule's events; slots refused at the door of the append are missed.

        An append refused before it is sent (a payload its contract does not
        take, say) would fail the whole pass, every schedule with it: the
        slots it would fire go on record instead, missed for ``refused``, with
        the reason in the host's log, and the pass goes on.
        """
        try:
            return args.append(*events)
        except StreamkitError as exc:
            if exc.retryable:
                raise
            slots = sorted(e["payload"]["slot"] for e in events if e["type"] == SCHEDULE_FIRED)
            _log.error(
                "schedule.slot_refused",
                name=name,
                error=exc.message,
                detail="its slots are recorded as missed (refused) until it is defined again",
            )
            kept = [e for e in events if e["type"] == SCHEDULE_MISSED]
            if slots:
                refused = Missed("refused", instant(slots[0]), instant(slots[-1]), len(slots))
                kept.append(missed_event(name, refused))
            return args.append(*kept)

    def _undeclared(self, schedule: Schedule) -> str | None:
        """The event type an AppendEvent schedule names that this processor may not emit."""
        action = schedule.action
        if isinstance(action, AppendEvent) and action.type not in self.contract.emits:
            return action.type
        return None

    def _overlap(
        self,
        schedule: Schedule,
        entry: ScheduleEntry,
        slots: tuple[datetime, ...],
        clock: datetime,
        through: datetime,
    ) -> tuple[list[dict[str, Any]], datetime]:
        """The events of the slots due now, by the overlap policy; how far they decide.

        A slot that waited (``buffer_*``) fires first, once no task of the
        schedule runs. A slot whose jittered instant is still ahead stops the
        run: the next pass decides it.
        """
        name, policy = schedule.name, schedule.overlap
        undeclared = self._undeclared(schedule)
        if undeclared is not None:
            # Appending it would be refused on every pass: every slot is on record instead.
            decided = [s for s in slots if s + jitter(name, s, schedule.jitter) <= clock]
            if decided:
                _log.error(
                    "schedule.undeclared_event",
                    name=name,
                    type=undeclared,
                    detail="the schedules processor may not append this type: give it the "
                    "contract that defines it (emits=...); its slots are missed meanwhile",
                )
                run = Missed("undeclared", decided[0], decided[-1], len(decided))
                return [missed_event(name, run)], max(through, decided[-1])
            return [], through
        running = list(entry.running)
        buffered = list(entry.buffered)
        events: list[dict[str, Any]] = []
        if buffered and not running:
            slot = instant(buffered.pop(0))
            events += fired_events(schedule, slot)
            running.append(task_id_of(name, slot))
        missed: list[tuple[MissedReason, datetime]] = []
        for slot in slots:
            if slot + jitter(name, slot, schedule.jitter) > clock:
                break  # its jittered instant is still ahead: the next pass fires it
            through = max(through, slot)
            if policy == "allow_all" or not (running or buffered):
                events += fired_events(schedule, slot)
                running.append(task_id_of(name, slot))
            elif policy == "cancel_other":
                events += [cancel_event(task_id, name, slot) for task_id in running]
                events += fired_events(schedule, slot)
                running = [task_id_of(name, slot)]
            elif policy == "skip":
                missed.append(("overlap", slot))
            elif len(buffered) < (1 if policy == "buffer_one" else schedule.max_buffered):
                events.append(buffered_event(name, slot))
                buffered.append(seconds(slot))
            else:
                missed.append(("buffer_full", slot))
        events += [missed_event(name, run) for run in missed_runs(missed)]
        return events, through

    def _schedule(self, entry: ScheduleEntry) -> Schedule | None:
        """The schedule a definition records, built once per definition (None: refused)."""
        definition = entry.definition
        built = self._built.get(definition.name)
        if built is not None and built[0] is definition:
            return built[1]
        try:
            schedule: Schedule | None = schedule_of(definition.model_dump(mode="json"))
        except StreamkitError as exc:
            _log.error(
                "schedule.definition_refused",
                name=definition.name,
                error=exc.message,
                detail="this schedule fires nothing until it is defined again",
            )
            schedule = None
        self._built[definition.name] = (definition, schedule)
        return schedule
