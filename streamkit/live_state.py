"""Live state: one value, its revision chain, and the deltas clients follow it by.

A :class:`LiveState` holds a value and a revision number. :meth:`LiveState.set`
replaces the value; when the value's JSON form really changed, the revision
moves by one and one ephemeral ``streamkit.live-state-changed`` event carrying
``{key, from, to, patch}`` (an RFC 6902 JSON patch) goes to the sink. The stream
keeps nothing per client: a client seeds itself from :meth:`LiveState.snapshot`,
applies each delta whose ``from`` equals the revision it holds, and re-seeds on
any gap or on ``patch: null``.

Guarantees:

- The revision starts at a per-incarnation epoch (never 0, and within one
  process above every revision an earlier LiveState minted), so a client that
  holds a revision of an earlier incarnation sees a gap and re-seeds instead of
  patching a base it does not have.
- Revisions are contiguous: each delta goes from ``rev`` to ``rev + 1``.
- Deltas reach the sink one at a time, in revision order: a delta's ``append``
  is called only after the previous one's settled.
- :meth:`LiveState.set` never raises. A failed diff or a failed append costs a
  notification (reported through structlog), never the value: the next delta
  shows a gap and clients re-seed.

Values are compared and diffed in their JSON form (pydantic models through
``model_dump(mode="json")``). Build a new value for each ``set``; mutating the
held value in place defeats the diff, since the same object is taken as no
change.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import secrets
import threading
import time
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import jsonpatch
import structlog
from pydantic import BaseModel

from streamkit._json_diff import REPLACE_OVERHEAD, diff, no_larger_than_replace
from streamkit._json_walk import ABSENT, Step, Unplanned, step
from streamkit._speed import FAST as SPEED_TRICKS
from streamkit.errors import InvalidRequest

__all__ = [
    "LIVE_STATE_CHANGED",
    "MAX_PATCH_BYTES",
    "LiveSnapshot",
    "LiveState",
    "LiveStateSink",
    "apply_delta",
]

REUSE_FORMS = SPEED_TRICKS
"""Whether a pydantic value's form and patch are walked beside the last one (a speed trick).

Off under ``STREAMKIT_PLAIN=1``: every value is then serialized, parsed and
diffed whole. Both give the same deltas (a hypothesis test holds them to it).
"""

LIVE_STATE_CHANGED = "streamkit.live-state-changed"
"""The type of the ephemeral delta event. No processor ever reduces it."""

MAX_PATCH_BYTES = 1024 * 1024
"""The largest delta event (type plus payload, compact JSON) sent with its patch.

Past it the delta goes with ``patch: None``: a patch that size costs every
watcher about as much as a re-seed, and the log would refuse the event anyway.
"""

S = TypeVar("S")

_log = structlog.get_logger("streamkit.live_state")

_COMPACT = (",", ":")


class LiveStateSink(Protocol):
    """Where a :class:`LiveState` sends its deltas.

    A :class:`~streamkit.protocols.ProcessorStream` fits (its ``append`` is a
    coroutine); so does any object whose ``append`` returns a plain value.
    """

    def append(self, *events: Mapping[str, Any]) -> object:
        """Take the delta event; may return an awaitable that settles once it is sent."""
        ...


class LiveSnapshot(NamedTuple):
    """The seed a client starts from: a revision and the value at that revision."""

    rev: int
    state: Any


class _RevisionFloor:
    """The highest revision minted in this process, so a new epoch starts above it.

    The wall-clock epoch alone separates incarnations across processes (a restart
    takes far longer than a millisecond); inside one process two LiveStates for
    the same key may be built within the same millisecond, and the floor keeps
    the newer one's revisions clear of the older one's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._high = 0

    def note(self, rev: int) -> None:
        with self._lock:
            if rev > self._high:
                self._high = rev

    def next_epoch(self) -> int:
        candidate = time.time_ns() // 1_000_000 * 4096 + secrets.randbits(12)
        with self._lock:
            epoch = max(candidate, self._high + 1, 1)
            self._high = epoch
            return epoch


_floor = _RevisionFloor()


class _NoBase:
    """Marks a diff base that clients cannot hold (nothing serializable was sent yet)."""

    def __repr__(self) -> str:
        return "<no serializable base>"


_NO_BASE = _NoBase()


def _json_default(value: object) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"a {type(value).__name__} is not JSON serializable")


def _serialize(value: object) -> str:
    """The value as clients receive it; raises on anything JSON cannot carry.

    A pydantic model is written by pydantic's own serializer (compiled, many
    times faster than dumping it to Python objects for :func:`json.dumps`),
    with the same JSON as its checkpoint: a NaN or an infinity in a model
    field is ``null`` there, as in the checkpoint.
    """
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, default=_json_default, allow_nan=False, separators=_COMPACT)


class LiveState(Generic[S]):
    """One value and its revision chain, published as JSON-patch deltas through a sink.

    ``key`` names the value in every delta (the engine uses the processor slug).
    ``epoch`` fixes the starting revision (a positive integer); by default it is
    derived from wall time in milliseconds times 4096 plus 12 random bits.
    """

    def __init__(
        self,
        sink: LiveStateSink,
        key: str,
        initial: S,
        *,
        epoch: int | None = None,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise InvalidRequest(
                f"a live state key must be a non-empty string, got {key!r}; nothing was created",
                details={"key": repr(key)[:200]},
            )
        if epoch is None:
            epoch = _floor.next_epoch()
        elif isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
            raise InvalidRequest(
                f"a live state epoch must be a positive integer (0 is what a client holds before "
                f"its first seed), got {epoch!r}; omit it to derive one from the clock",
                details={"epoch": repr(epoch)[:200]},
            )
        else:
            _floor.note(epoch)
        self._sink = sink
        self._key = key
        # The delta's size but for its revisions and patch: the type plus the compact
        # envelope, whose only variable parts are those (measured with 0, 0 and null).
        self._delta_overhead = (
            len(LIVE_STATE_CHANGED)
            + len(json.dumps({"key": key, "from": 0, "to": 0, "patch": None}, separators=_COMPACT))
            - len("0") * 2
            - len("null")
        )
        self._state: S = initial
        self._rev = epoch
        # The diff base: the last value that serialized, i.e. what a client that
        # applied every delta holds. Kept apart from the held value so a value
        # the wire cannot carry never becomes the base later diffs start from.
        # With REUSE_FORMS (a speed trick), a pydantic value's form and patch are
        # built side by side with the base value (the value the base form is the
        # form of), walking only what changed (streamkit._json_walk).
        self._reuse_forms = REUSE_FORMS
        self._base_value: Any = ABSENT
        self._base_text: str | None = None
        self._base_form: Any = _NO_BASE
        try:
            _, self._base_text, self._base_form = self._build(initial)
            self._base_value = initial
        except Exception as exc:  # anything json refuses (TypeError, ValueError, RecursionError)
            self._base_text, self._base_form = None, _NO_BASE
            _log.warning(
                "live_state.unserializable_initial",
                key=key,
                rev=epoch,
                error=repr(exc),
                exc_info=exc,
            )
        # The delta chain: the last append task, and how many are issued but unsettled.
        self._tail: asyncio.Task[None] | None = None
        self._pending = 0

    @property
    def key(self) -> str:
        """The name every delta carries."""
        return self._key

    @property
    def pending(self) -> int:
        """Delta appends issued but not yet settled."""
        return 0 if self._in_flight() is None else self._pending

    def get(self) -> S:
        """The current value (reflects every :meth:`set`, serializable or not)."""
        return self._state

    def snapshot(self) -> LiveSnapshot:
        """The seed read: the revision and the value at it, read together."""
        return LiveSnapshot(self._rev, self._state)

    def set(self, next: S) -> None:
        """Replace the value; on a real JSON change, move the revision and send a delta.

        The same object as the held value is no change. Equal JSON moves nothing.
        A value JSON cannot carry is adopted and moves the revision without a
        delta (so clients see a gap); the next serializable value diffs from what
        clients last received. Never raises: failures are reported and swallowed.
        """
        try:
            self._set(next)
        except Exception as exc:  # the contract: a notification may be lost, the caller never fails
            _log.exception("live_state.set_failed", key=self._key, rev=self._rev, error=repr(exc))

    def rebase(self, value: S) -> LiveSnapshot:
        """Adopt ``value`` as the present without sending a delta; return the new seed.

        For a publisher that let the value fall behind while nobody watched:
        the next client seeds from the returned snapshot. If the JSON changed,
        the revision moves by one with no delta for it, so a client still
        holding an earlier revision sees a gap at the next delta and re-seeds.
        Later :meth:`set` calls diff from ``value``. Never raises.
        """
        try:
            self._rebase(value)
        except Exception as exc:  # as set(): the caller never fails
            _log.exception("live_state.set_failed", key=self._key, rev=self._rev, error=repr(exc))
        return self.snapshot()

    def _rebase(self, value: S) -> None:
        self._state = value
        walked: Step | None = None
        try:
            walked, text, form = self._build(value)
        except Exception as exc:
            text, form = None, _NO_BASE
            _log.warning(
                "live_state.unserializable",
                key=self._key,
                rev=self._rev,
                error=repr(exc),
                exc_info=exc,
            )
        if form is not _NO_BASE and self._same_json(walked, text, form):
            self._base_value = value
            return
        self._adopt(value, text, form)
        self._rev += 1
        _floor.note(self._rev)

    def _build(self, value: object) -> tuple[Step | None, str | None, Any]:
        """The value's form, and its JSON text or (walked beside the base) its patch.

        A pydantic value is walked beside the base value when it can be: only
        what changed is visited, and the step carries the ops from the base
        form. Otherwise it is serialized and parsed. Raises what the plain
        path raises for a value JSON cannot carry.
        """
        if self._reuse_forms and isinstance(value, BaseModel):
            based = self._base_form is not _NO_BASE
            try:
                walked = step(
                    value,
                    self._base_value if based else ABSENT,
                    self._base_form if based else ABSENT,
                )
            except (Unplanned, RecursionError):
                pass
            else:
                return walked, None, walked.form
        text = _serialize(value)
        return None, text, json.loads(text)

    def _adopt(self, value: object, text: str | None, form: Any) -> None:
        """Make ``form`` (of ``value``; ``text`` if known) the base later deltas start from."""
        self._base_text, self._base_form = text, form
        self._base_value = ABSENT if form is _NO_BASE else value

    def _same_json(self, walked: Step | None, text: str | None, form: Any) -> bool:
        """Whether ``form`` is the diff base's JSON value, under strict JSON equality."""
        if self._base_form is _NO_BASE:
            return False
        if walked is not None:
            return not walked.ops
        if text is not None and self._base_text is not None:
            return text == self._base_text
        return not diff(self._base_form, form)

    async def drain(self) -> None:
        """Wait until every delta append issued so far has settled.

        Cancelling the wait does not cancel the appends. Appends issued on
        another event loop cannot be awaited here and are not waited for.
        """
        tail = self._in_flight()
        if tail is None or tail.get_loop() is not asyncio.get_running_loop():
            return
        await asyncio.wait((tail,))

    def _set(self, next: S) -> None:
        if next is self._state:
            return
        walked: Step | None = None
        try:
            walked, text, form = self._build(next)
        except Exception as exc:
            self._state = next
            self._rev += 1
            _floor.note(self._rev)
            _log.warning(
                "live_state.unserializable",
                key=self._key,
                rev=self._rev,
                error=repr(exc),
                exc_info=exc,
                detail="value adopted without a delta; clients will see a gap and re-seed",
            )
            return
        self._state = next
        if text is not None and text == self._base_text:
            self._base_value = next  # the same JSON: the base form is its form too
            return
        patch: list[dict[str, Any]] | None
        try:
            if self._base_form is _NO_BASE:
                patch = None
            elif walked is not None:
                patch = walked.ops
            else:
                patch = diff(self._base_form, form)
        except Exception as exc:
            # Serializable but not diffable here (nesting too deep, say): still a
            # change, so send it as a re-seed rather than lose it silently.
            _log.warning(
                "live_state.diff_failed",
                key=self._key,
                rev=self._rev,
                error=repr(exc),
                exc_info=exc,
            )
            form, patch, walked = _NO_BASE, None, None
        self._adopt(next, text, form)
        if patch is not None and not patch:
            # Equal JSON written differently (key order): nothing for clients.
            return
        from_rev = self._rev
        to_rev = from_rev + 1
        self._rev = to_rev
        _floor.note(to_rev)
        self._issue(
            {
                "type": LIVE_STATE_CHANGED,
                "ephemeral": True,
                "payload": {
                    "key": self._key,
                    "from": from_rev,
                    "to": to_rev,
                    "patch": self._wire_patch(patch, from_rev, to_rev, text, form, walked),
                },
            }
        )

    def _wire_patch(
        self,
        patch: list[dict[str, Any]] | None,
        from_rev: int,
        to_rev: int,
        text: str | None,
        form: Any,
        walked: Step | None,
    ) -> list[dict[str, Any]] | None:
        """The patch as sent, or None if the delta would be too big.

        ``diff`` builds every op and value afresh, so the patch already shares
        nothing with the diff base and a sink that mutates it cannot corrupt the
        next diff; it goes out as it is, serialized here only to measure it. A
        patch larger than a ``replace`` of the whole value (``text``, parsed as
        ``form``) goes out as that replace instead. A walked form has no text:
        the floor on its size the walk found usually shows it is larger than
        the patch, and only otherwise is the whole form measured.
        """
        if patch is None:
            return None
        patch_text = json.dumps(patch, separators=_COMPACT)
        if text is None:
            if walked is not None and walked.floor >= len(patch_text) - REPLACE_OVERHEAD:
                return self._bounded(patch, patch_text, from_rev, to_rev)
            text = json.dumps(form, separators=_COMPACT)
        bounded = no_larger_than_replace(patch, len(patch_text), text, form)
        if bounded is not patch:
            patch = bounded
            patch_text = json.dumps(patch, separators=_COMPACT)
        return self._bounded(patch, patch_text, from_rev, to_rev)

    def _bounded(
        self, patch: list[dict[str, Any]], patch_text: str, from_rev: int, to_rev: int
    ) -> list[dict[str, Any]] | None:
        """The patch, or None if its delta event would pass :data:`MAX_PATCH_BYTES`."""
        size = self._delta_overhead + len(str(from_rev)) + len(str(to_rev)) + len(patch_text)
        if size > MAX_PATCH_BYTES:
            _log.info(
                "live_state.patch_too_large",
                key=self._key,
                to_rev=to_rev,
                size=size,
                limit=MAX_PATCH_BYTES,
            )
            return None
        return patch

    def _issue(self, event: dict[str, Any]) -> None:
        """Send one delta after every earlier one settled; never raises."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        tail = self._in_flight()
        if tail is None:
            # Nothing in flight: call the sink now, so a synchronous sink has the
            # delta before set() returns. Order holds because nothing is queued.
            try:
                result = self._sink.append(event)
            except Exception as exc:
                self._report_lost(event, "the sink's append raised", exc)
                return
            if not inspect.isawaitable(result):
                return
            if loop is None:
                if inspect.iscoroutine(result):
                    result.close()  # never awaited: close it so it does not warn later
                self._report_lost(event, "the sink returned an awaitable outside an event loop")
                return
            self._start(loop, self._settle(event, None, result), event, result)
            return
        if loop is None or tail.get_loop() is not loop:
            self._report_lost(
                event, "an earlier delta is still in flight and this call has no loop to queue on"
            )
            return
        self._start(loop, self._settle(event, tail, None), event)

    def _in_flight(self) -> asyncio.Task[None] | None:
        """The last delta task while it is unsettled, else None.

        Each task starts its append only after the one before it settled, so the
        last one settling means every delta issued so far has.
        """
        tail = self._tail
        if tail is None or tail.done():
            return None
        if tail.get_loop().is_closed():
            # The loop that ran the chain is gone; its appends will never settle.
            self._tail, self._pending = None, 0
            return None
        return tail

    def _start(
        self,
        loop: asyncio.AbstractEventLoop,
        work: Coroutine[Any, Any, None],
        event: dict[str, Any],
        started: Awaitable[object] | None = None,
    ) -> None:
        self._pending += 1
        task = loop.create_task(work)
        # A done callback (not a finally) so a task cancelled before it ever ran
        # still settles the count, and closes the sink's append it was to await.
        task.add_done_callback(functools.partial(self._settled, event, started))
        self._tail = task

    def _settled(
        self, event: dict[str, Any], started: Awaitable[object] | None, task: asyncio.Task[None]
    ) -> None:
        self._pending = max(0, self._pending - 1)
        if (
            task.cancelled()
            and inspect.iscoroutine(started)
            and inspect.getcoroutinestate(started) == inspect.CORO_CREATED
        ):
            # Cancelled before its first step, so _settle never awaited the append the
            # sink had begun: close it (else it warns when collected) and say so.
            started.close()
            self._report_lost(event, "the append was cancelled before it started")

    async def _settle(
        self,
        event: dict[str, Any],
        previous: asyncio.Task[None] | None,
        started: Awaitable[object] | None,
    ) -> None:
        try:
            if previous is not None and not previous.done():
                await asyncio.wait((previous,))
            result = started if started is not None else self._sink.append(event)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            self._report_lost(event, "the append was cancelled")
            raise
        except Exception as exc:
            self._report_lost(event, "the sink's append failed", exc)

    def _report_lost(
        self, event: dict[str, Any], why: str, exc: BaseException | None = None
    ) -> None:
        payload = event["payload"]
        _log.warning(
            "live_state.delta_lost",
            key=payload["key"],
            from_rev=payload["from"],
            to_rev=payload["to"],
            reason=why,
            error=None if exc is None else repr(exc),
            detail="clients will see a gap at the next delta and re-seed",
        )


def apply_delta(seed_state: Any, patch: Sequence[Mapping[str, Any]] | None) -> Any:
    """Apply a delta's JSON patch to a client's copy; return the new value.

    ``seed_state`` is not modified. A ``None`` patch (the delta was too large to
    send) or a patch that does not apply (the client's copy is not the base it
    was computed from) raises :class:`~streamkit.errors.InvalidRequest`: the way
    out is to re-seed from a snapshot.
    """
    if patch is None:
        raise InvalidRequest(
            "this delta carries no patch (it was too large to send, or the value could not be "
            "diffed); the copy was not changed; re-seed from a snapshot",
            details={},
        )
    try:
        return jsonpatch.apply_patch(seed_state, list(patch), in_place=False)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as exc:
        raise InvalidRequest(
            f"the patch does not apply to this copy ({exc}); it was computed against a different "
            "base; the copy was not changed; re-seed from a snapshot",
            details={"error": str(exc)},
        ) from exc
