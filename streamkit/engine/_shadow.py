"""A version built in the shadow: reduced up to the serving version's cursor, then cut over.

A processor whose contract version does not serve yet (another version
serves, or the serving state no longer restores) first builds its state in
the shadow, reduce only, from where its own checkpoint row left it, and then
cuts over (:meth:`ShadowBuild.build`). The guarantees:

- It never reduces past the serving version's cursor before the cutover: a
  push queued behind the build would otherwise look stale and lose its
  effects.
- The serving version is fenced before the last stretch is reduced, so the
  cutover is made at its final cursor and every event has its effects under
  exactly one version.
- Its own row is written every :data:`~._rebuild.CHECKPOINT_EVERY` seconds,
  so a crash resumes there; a stop or hand-off while it waits for a manual
  cutover writes it where it stands.
- An operator who asked for a manual cutover gets its offset, or the error
  that ended the attempt (:class:`~._cutover_gate.CutoverGate`).
- An automatic cutover never makes things worse unseen: a version whose
  build skipped more events (malformed payloads, failed reduces, counted by
  its :class:`~._skip_tally.SkipTally`) than the version it replaces did,
  by that version's kept tally, holds at the serving cursor as a manual
  one does, with the reason in ``status``, until an operator cuts over by
  hand. (A build that stalls never gets here: it does not cut over.)

The part owns what only this work needs: where the build must reach, the
build under way (a :class:`~._rebuild.Rebuild`, what ``statistics()``
shows), the cutover gate and the host's ``give_way``. It never writes the
engine's state or cursor: it returns what it built, and tells the engine's
``resume`` each row it wrote on the way (where a failure or a stop leaves
the engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, NamedTuple, TypeVar

from streamkit.engine._checkpointer import Checkpointer
from streamkit.engine._cutover_gate import FOLLOW_EVERY, CutoverGate
from streamkit.engine._pages import PAGE_SIZE, PageReader
from streamkit.engine._rebuild import Rebuild
from streamkit.engine._skip_tally import SkipTally
from streamkit.errors import CutoverRaced, InvalidRequest, ProcessorTimeout, StreamkitError

__all__ = ["Built", "ShadowBuild"]

S = TypeVar("S")


class Built(NamedTuple, Generic[S]):
    """A build that cut over: the state at the cutover offset, and the events it folded."""

    state: S
    through: int
    folded: int


class ShadowBuild(Generic[S]):
    """The shadow build and cutover of one engine's version (see the module).

    ``yielding()`` says whether the engine is stopping or handing off;
    ``latched()`` is the engine's latched refusal, if any; ``resume(through,
    state)`` is told each row of the shadow written on the way.
    """

    def __init__(
        self,
        slug: str,
        version: str,
        *,
        pages: PageReader[S],
        checkpoints: Checkpointer[S],
        gate: CutoverGate,
        tally: SkipTally,
        give_way: Callable[[float], Awaitable[float]] | None,
        yielding: Callable[[], bool],
        latched: Callable[[], StreamkitError | None],
        resume: Callable[[int, S], None],
    ) -> None:
        self._slug = slug
        self._version = version
        self._pages = pages
        self._checkpoints = checkpoints
        self._gate = gate
        self._tally = tally
        self._give_way = give_way
        self._yielding = yielding
        self._latched = latched
        self._resume = resume
        self.stale_through: int | None = None
        """The serving cursor to build up to (None: this version serves; known once restored)."""
        self.rebuild: Rebuild | None = None
        """The build under way, if one is."""

    @property
    def in_shadow(self) -> bool:
        return self.stale_through is not None

    def snapshot(self) -> dict[str, Any] | None:
        """The build under way as ``statistics()`` shows it (None: none runs)."""
        return None if self.rebuild is None else self.rebuild.snapshot()

    async def build(self, state: S, cursor: int) -> Built[S] | None:
        """Build from ``(state, cursor)`` up to the serving cursor, then cut over.

        With a manual cutover, once built it follows the serving cursor until
        an operator asks. None when there is nothing to build, or when a stop
        or hand-off ended the wait for a manual cutover (the shadow's row is
        written where it stands). An error leaves nothing cut over; the
        engine restores again before its next work.
        """
        target = self.stale_through
        if target is None:
            return None
        rebuild = self.rebuild = Rebuild(self._slug, self._version, target, cursor, self._give_way)
        checkpoints, gate, pages, resume = self._checkpoints, self._gate, self._pages, self._resume

        async def save(through: int, reduced: S) -> None:
            if rebuild.checkpoint_due():
                await checkpoints.write_state(through, reduced)
                resume(through, reduced)

        try:
            state, folded = await pages.replay(
                state, cursor, target, PAGE_SIZE, rebuild.advanced, save, turns=rebuild.turns
            )
            gate.held = None
            if not gate.manual:
                held = await self._skipped_more()
                if held is not None:
                    gate.hold(held)
            if gate.manual:
                state, target, more = await self._follow_serving(rebuild, state, target, save)
                folded += more
                if not gate.asked:
                    return None  # stopping or handing off: the shadow's row is written
            # The serving version moves no more from here: reduce what it served since.
            final = await checkpoints.fence_serving()
            if final > target:
                reached, rebuild.target, target = target, final, final
                state, more = await pages.replay(
                    state, reached, target, PAGE_SIZE, rebuild.advanced
                )
                folded += more
            await checkpoints.cut_over(target, state)
        except BaseException as exc:
            gate.failed(self._failure(exc))
            raise
        finally:
            self.rebuild = None
        rebuild.done()
        gate.done(target)
        self.stale_through = None
        return Built(state, target, folded)

    async def _follow_serving(
        self,
        rebuild: Rebuild,
        state: S,
        target: int,
        save: Callable[[int, S], Awaitable[None]],
    ) -> tuple[S, int, int]:
        """Hold at the serving cursor until an operator asks for the cutover (manual mode).

        Every :data:`~._cutover_gate.FOLLOW_EVERY` seconds the serving cursor
        is read again and the events it moved past are reduced (so the
        cutover, when asked for, has a batch or two left to do), and the
        shadow's row is written when due. Returns the state and where it is
        reduced through once asked, or when the engine is stopping or handing
        off (then with the shadow's row written there, for the next holder),
        with the number of events folded meanwhile. CutoverRaced if another
        version serves meanwhile.
        """
        gate, checkpoints = self._gate, self._checkpoints
        gate.waiting = True
        rebuild.wait_for_cutover(gate.held)
        # Built: its row now, so the comparison shows its state at once and a crash
        # resumes here.
        await checkpoints.write_state(target, state)
        self._resume(target, state)
        folded = 0
        while not await gate.asked_within(FOLLOW_EVERY):
            if self._yielding():
                await checkpoints.write_state(target, state)
                self._resume(target, state)
                break
            serving = await checkpoints.serving_cursor()
            if serving > target:
                reached, rebuild.target, target = target, serving, serving
                state, more = await self._pages.replay(
                    state, reached, target, PAGE_SIZE, rebuild.advanced, save, rebuild.turns
                )
                folded += more
        return state, target, folded

    async def _skipped_more(self) -> str | None:
        """Why this built version must not cut over by itself, or None (see the module)."""
        tally = self._tally
        if tally.skipped == 0:
            return None
        replaced = await self._checkpoints.replaced_tally() or {}
        before = int(replaced.get("malformed_payloads") or 0) + int(
            replaced.get("reduce_failures") or 0
        )
        if tally.skipped <= before:
            return None
        kinds = [
            f"{kind['count']} malformed {kind['type']!r} v{kind['version']} payload(s) from "
            f"offset {kind['first_offsets'][0]}"
            for kind in tally.malformed_by_type()
        ] + [
            f"{kind['count']} {kind['type']!r} event(s) its reduce raised on from offset "
            f"{kind['first_offsets'][0]}"
            for kind in tally.reduce_failures_by_type()
        ]
        old = self._checkpoints.replacing
        return (
            f"version {self._version} skipped {tally.skipped} event(s) ({'; '.join(kinds)}) "
            f"where version {old} skipped {before}: cutting over by itself would serve a state "
            "that omits them; deploy a version that reads them, or cut over by hand if that "
            f"is intended (`streamkit processor cutover {self._slug}`)"
        )

    def ask(self, loaded: bool) -> asyncio.Future[int]:
        """An operator's request for a manual cutover; the future gets its offset.

        InvalidRequest (nothing done) when the cutover is automatic, or when
        this version serves already (``loaded``: the checkpoints were read).
        """
        if not self._gate.manual:
            raise InvalidRequest(
                f"processor {self._slug!r} version {self._version}: its cutover is automatic "
                '(as soon as it is caught up); nothing was done; set cutover = "manual" to '
                "decide it",
                details={"slug": self._slug, "version": self._version, "reason": "automatic"},
            )
        if loaded and self.stale_through is None:
            raise InvalidRequest(
                f"processor {self._slug!r} version {self._version} serves already; nothing "
                "was cut over",
                details={"slug": self._slug, "version": self._version, "reason": "serving"},
            )
        return self._gate.ask()

    async def committed(self, asked: asyncio.Future[int], timeout: float | None) -> int:  # noqa: ASYNC109
        """The offset ``asked`` gets; ProcessorTimeout after ``timeout`` seconds (it may still come)."""
        try:
            return await asyncio.wait_for(asyncio.shield(asked), timeout)
        except TimeoutError:
            raise ProcessorTimeout(
                f"processor {self._slug!r} version {self._version}: the cutover did not "
                f"commit within {timeout} s (the build is still under way?); it still "
                "happens once the build is done; watch `status`",
                details={"slug": self._slug, "version": self._version, "timeout": timeout},
            ) from None

    def _failure(self, exc: BaseException) -> StreamkitError:
        """What an operator who asked for the cutover is told when the attempt ended without it."""
        if isinstance(exc, StreamkitError):
            return exc
        latched = self._latched()
        if latched is not None:
            return latched
        return CutoverRaced(
            f"the build of version {self._version} of {self._slug!r} stopped before its "
            f"cutover ({type(exc).__name__}); nothing was cut over; it resumes from its "
            "checkpoint: ask again once it waits for the cutover",
            details={"slug": self._slug, "version": self._version},
        )
