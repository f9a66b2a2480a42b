"""The author's side of a processor: the class you subclass, and what its hooks receive.

A :class:`StreamProcessor` is plain Python: a contract, a pure :meth:`reduce`, an
effect hook :meth:`process_event`, and a :meth:`project_live_state` view. It
holds no stream and no storage, so a unit test builds it with no arguments and
folds events through it (``streamkit.testing.reduce_processor``). A
:class:`~streamkit.engine.ProcessorEngine` drives one instance over a stream.

:func:`consumes_predicate` is the one consumes rule (:func:`consumes_event` asks it
about one event), used by the engine, the test harness and subscriptions alike:

- ``consumes`` None, or containing ``"*"``: every DURABLE event;
- a type named in ``consumes``: that type, ephemeral or not;
- ``"*"`` never sweeps ephemerals: an ephemeral arrives only when named.

The engine additionally never reduces or reacts to the live-state delta type,
whatever ``consumes`` says (a delta is about state; feeding it back would loop).
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from streamkit.errors import InvalidRequest
from streamkit.events import EventInput, StreamEvent

if TYPE_CHECKING:
    import asyncio

    from streamkit.contract import ProcessorContract
    from streamkit.protocols import StreamAccess

__all__ = [
    "USER_EXITS",
    "Delivery",
    "ExitRefused",
    "ProcessEventArgs",
    "StreamProcessor",
    "check_work",
    "consumes_event",
    "consumes_predicate",
    "retain_of",
]

State = TypeVar("State")

Work = Callable[[], Awaitable[object]]
"""What ``block_processor_while`` and ``run_in_background`` take: ``fn() -> awaitable``."""


class ExitRefused(RuntimeError):
    """Code a processor or a task handler runs raised ``SystemExit`` or ``KeyboardInterrupt``.

    The host owns its process's exit (its signals, its stop). An exit raised
    inside one processor's code would stop every processor mid-batch, and a
    task attempt it interrupted would stop the next host too, once per
    attempt left. So it is held as a failure of that code instead: retried,
    counted and shown like any other error, and the host keeps running.
    """


USER_EXITS = (SystemExit, KeyboardInterrupt)
"""What :class:`ExitRefused` stands in for when user code raises it."""


def exit_refused(exc: BaseException, where: str) -> ExitRefused:
    """The failure ``exc`` (one of :data:`USER_EXITS`) raised in ``where`` is held as."""
    shown = ", ".join(repr(arg) for arg in exc.args)
    return ExitRefused(
        f"{where} raised {type(exc).__name__}({shown}), which would stop the whole host; "
        "the host kept running and counts it as a failure of that code"
    )


def consumes_predicate(
    consumes: Collection[str] | None, *, never: Collection[str] = ()
) -> Callable[[StreamEvent], bool]:
    """The consumes rule for one ``consumes`` list, compiled: ``event -> bool``.

    ``never`` names types refused whatever ``consumes`` says (the engine passes
    the live-state delta type). Built once per processor; it runs once per
    event on the catch-up path, so the named-only case checks the type alone.
    A durable event's answer depends on its type alone, and an ephemeral one
    is taken only if a durable one of its type would be: the engine's fold
    caches the answer per type on that promise.
    """
    refused = frozenset(never)
    named = frozenset(consumes or ()) - refused
    if consumes is not None and "*" not in named:

        def consumes_named(event: StreamEvent) -> bool:
            return event.type in named

        return consumes_named

    def consumes_durable(event: StreamEvent) -> bool:
        if event.ephemeral:
            return event.type in named
        return event.type not in refused

    return consumes_durable


def consumes_event(
    consumes: Collection[str] | None, event: StreamEvent | Mapping[str, Any]
) -> bool:
    """Whether a processor (or subscriber) with this ``consumes`` list receives ``event``.

    ``event`` is a :class:`~streamkit.events.StreamEvent` or a mapping with
    ``type`` and, optionally, ``ephemeral``.
    """
    if isinstance(event, Mapping):
        event = StreamEvent(
            path="/",
            offset=0,
            type=str(event.get("type")),
            ephemeral=bool(event.get("ephemeral", False)),
        )
    return consumes_predicate(consumes)(event)


def check_work(work: object, verb: str) -> None:
    """Refuse anything but a function for ``block_processor_while``/``run_in_background``."""
    if not callable(work):
        if inspect.iscoroutine(work):
            work.close()  # it can never run now; closing it avoids a never-awaited warning
        raise InvalidRequest(
            f"{verb} takes a function that returns an awaitable (e.g. `lambda: send(x)` or an "
            f"async function), got {type(work).__name__}; nothing was started",
            details={"verb": verb},
        )


class Delivery:
    """How an event reached ``process_event``.

    ``caught_up`` is True on the at-head pass: the last consumable event of a
    batch that reached the head of the stream, or the eventless pass
    (``event=None``) of a batch that reached the head without one. That pass is
    where a processor looks at its state and starts whatever is still owed.
    """

    __slots__ = ("caught_up",)

    def __init__(self, caught_up: bool) -> None:
        self.caught_up = caught_up

    def __repr__(self) -> str:
        return f"Delivery(caught_up={self.caught_up})"


class EffectHost(Protocol):
    """What :class:`ProcessEventArgs` needs from the engine that built it (engine-internal)."""

    def emit(
        self, during: StreamEvent | None, events: Sequence[EventInput | Mapping[str, Any]]
    ) -> asyncio.Task[list[StreamEvent]]: ...

    def start_background(self, during: StreamEvent | None, work: Work) -> None: ...

    def request_wakeup(self, at: float) -> None: ...

    def track_cancelled(self, work: asyncio.Future[Any], label: str) -> None: ...

    def now(self) -> float: ...

    @property
    def stream(self) -> StreamAccess: ...

    def clients_first(self) -> bool: ...

    def guard(self) -> None: ...


class ProcessEventArgs(Generic[State]):
    """What ``process_event`` receives: the event, the states around it, and the effect verbs.

    ``event`` is None on the eventless at-head pass. ``state`` is the state
    after reducing ``event``; ``previous_state`` the state before it. On a
    declared event type, ``event.payload`` is the validated payload model.
    """

    __slots__ = (
        "_appends",
        "_blockers",
        "_host",
        "_open",
        "delivery",
        "event",
        "previous_state",
        "state",
    )

    def __init__(
        self,
        host: EffectHost,
        event: StreamEvent | None,
        state: State,
        previous_state: State,
        caught_up: bool,
    ) -> None:
        self._host = host
        self.event = event
        self.state = state
        self.previous_state = previous_state
        self.delivery = Delivery(caught_up)
        self._blockers: deque[Work] = deque()
        self._appends: list[asyncio.Task[list[StreamEvent]]] = []
        self._open = True

    def append(self, *events: EventInput | Mapping[str, Any]) -> asyncio.Task[list[StreamEvent]]:
        """Append to this processor's stream; the append starts at once.

        Returns a task to await for the committed events. A type the contract
        does not list in ``emits`` raises
        :class:`~streamkit.errors.UndeclaredEmit` here, before anything starts.
        Each event's ``source.processor`` is stamped with this processor's slug
        and version and, unless this is the eventless pass, the offset and type
        of the event being processed. Use :meth:`StreamProcessor.idempotency_key`
        so a batch that is retried after a failure does not append twice.

        An append started while this event is delivered (by ``process_event``
        or a blocker) belongs to the batch even if nothing awaits it: the
        batch's checkpoint waits for it, and if its write did not land (a
        :class:`~streamkit.errors.StorageError`: the connection broke, a lock
        timed out) the batch fails and is retried, effects and all. A refusal
        (an idempotency conflict, say) is reported, not retried.
        """
        task = self._host.emit(self.event, events)
        if self._open:
            self._appends.append(task)
        return task

    def block_processor_while(self, fn: Work) -> None:
        """Hold the cursor until ``fn()`` settles: the next event waits for it.

        Blockers of one event run one after another in the order registered,
        including blockers registered by running blockers, until none is left.
        A blocker that raises fails the batch: nothing is checkpointed and the
        batch is retried whole, so its effects must tolerate a second run.
        """
        check_work(fn, "block_processor_while")
        if not self._open:
            raise InvalidRequest(
                "block_processor_while was called after the delivery of this event finished "
                "(from background work, say); the cursor has moved on, so nothing can hold it; "
                "use run_in_background for work that outlives its event",
                details={"offset": None if self.event is None else self.event.offset},
            )
        self._blockers.append(fn)

    def run_in_background(self, fn: Work) -> None:
        """Start ``fn()`` without waiting for it; later events may overtake it.

        Its outcome must be recoverable from state at the next at-head pass:
        while any attempt is in flight the engine holds a claim that revives the
        processor if the host dies. A failure is reported, never raised.
        """
        check_work(fn, "run_in_background")
        self._host.start_background(self.event, fn)

    def schedule_wakeup(self, at: float) -> None:
        """Ask to be revived at epoch second ``at`` (an at-head pass then runs).

        Wakeups are re-derived at every at-head pass: the set kept is what the
        latest at-head pass asked for (plus requests made since), so derive them
        from state in the ``delivery.caught_up`` pass.
        """
        self._host.request_wakeup(at)

    def track_cancelled(self, work: asyncio.Future[Any], label: str) -> None:
        """Hand the engine a task you started and just cancelled, named by ``label``.

        Work that catches ``CancelledError`` and goes on cannot be stopped;
        still running a couple of seconds after its cancel, it is counted and
        named in ``status`` (``refusing_cancel``), ``/metrics`` and the admin
        page, and a host's stop does not wait for it. The tasks processor
        hands over each handler call it cancels (a timeout, a cancel, a stop).
        """
        self._host.track_cancelled(work, label)

    def now(self) -> float:
        """The time (epoch seconds) by the clock the engine was given.

        The clock that claims and wakeups are judged by (``clock=`` of the
        engine, a :class:`~streamkit.testing.ManualClock` in a test): compare a
        due time with this, not with :func:`time.time`, and a test that moves
        its clock moves the processor's "now" with it.
        """
        return self._host.now()

    @property
    def stream(self) -> StreamAccess:
        """The stream this processor runs on: ``read`` it, or ``append`` outside the contract.

        For a processor that looks things up in its own log (the DLQ reads the
        records it replays) or re-appends events of types it does not emit (the
        DLQ's replays): the engine's own stream, fenced by the host's lease, so
        nothing needs the database named twice. :meth:`append` is the verb for
        a processor's own events: it checks ``emits`` and stamps the source.
        """
        return self._host.stream

    def yield_to_clients(self) -> bool:
        """Whether the host asks its processors to hold back now, its clients appending.

        True while a host's clients append and it paces its processors
        (host.md, "Clients first"): work a processor may do now or leave to
        its next pass (filling a free slot between passes, say) is best left
        to the pass then. Always False for an engine used directly. It may be
        asked from background work too.
        """
        return self._host.clients_first()

    def __repr__(self) -> str:
        offset = None if self.event is None else self.event.offset
        return f"ProcessEventArgs(offset={offset}, caught_up={self.delivery.caught_up})"

    async def _deliver_to(
        self, processor: StreamProcessor[State]
    ) -> list[asyncio.Task[list[StreamEvent]]]:
        """(Engine use.) Run ``process_event``, then this event's blockers to a fixed point.

        A blocker may register more blockers: they belong to this event too, so
        the queue is drained until it stays empty. Afterwards the delivery is
        closed, whether it succeeded or raised. Returns the appends the
        delivery started, for the batch's checkpoint to wait for.
        """
        # The host's guard before each step: a host that lost the lease starts
        # no further effect, not even the next blocker of this event.
        guard = self._host.guard
        try:
            guard()
            processor.process_event(self)
            blockers = self._blockers
            while blockers:
                guard()
                result = blockers.popleft()()
                if inspect.isawaitable(result):
                    await result
        except USER_EXITS as exc:
            raise exit_refused(exc, "process_event or its blocking work") from exc
        finally:
            self._open = False
        return self._appends


class StreamProcessor(Generic[State]):
    """Subclass this: set ``contract`` and override the hooks you need.

    ``reduce`` must be pure (return a NEW state, or None to keep the current
    one; never mutate its arguments). ``process_event`` runs effects and is
    synchronous: it registers async work through its ``args``. Attributes of
    the instance are runtime state, gone with the host; only the reduced state
    is checkpointed.
    """

    contract: ProcessorContract[State]

    def reduce(self, event: StreamEvent, state: State) -> State | None:
        """Fold ``event`` into ``state``: return the next state, or None to keep it."""
        return None

    def process_event(self, args: ProcessEventArgs[State]) -> None:
        """React to an event (or, with ``args.event`` None, to reaching the head)."""
        return None

    def project_live_state(self, state: State) -> Any:
        """The view live-state clients see; by default the reduced state itself."""
        return state

    def status_summary(self, state: State) -> Mapping[str, Any] | None:
        """A few facts an operator reads beside the processor's row (``status``, the admin
        page), from the reduced state, e.g. ``{"missed": 3}``; None (the default) for none.

        Keep it small and cheap: it runs at every ``status``. Values must be JSON;
        one that raises is reported and shown as missing.
        """
        return None

    def retain_from(self, state: State) -> int | None:
        """The first offset of this processor's path that ``state`` still needs from the log.

        Retention never deletes an event at or after it, nor after the cursor
        (:mod:`streamkit.horizon`). None (the default): nothing before the
        cursor, the state holds all it needs. Override it when the state
        points back into the log, e.g. a queue whose records are read from
        their events later: return the offset of the oldest one still
        pending. Pure and cheap: it runs at every checkpoint write, on the
        state being written, and is stored with it. A value that is not None
        or an integer >= 0, or an exception, fails the batch and latches the
        engine (nothing is written): a wrong answer could let history go that
        the state needs.
        """
        return None

    def idempotency_key(self, key: str, event: StreamEvent | None = None) -> str:
        """A key namespaced by slug: ``"slug/key"``, or ``"slug/key@offset"`` for one event."""
        slug = self.contract.slug
        return f"{slug}/{key}" if event is None else f"{slug}/{key}@{event.offset}"


def retain_of(processor: StreamProcessor[State]) -> Callable[[State], int | None] | None:
    """``processor.retain_from`` if its class says something of its own, else None.

    The default keeps nothing back; not calling it spares every checkpoint a call.
    """
    if type(processor).retain_from is StreamProcessor.retain_from:
        return None
    return processor.retain_from
