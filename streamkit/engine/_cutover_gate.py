"""When a version built in the shadow may cut over: at once, or when an operator says so.

A new version builds in the shadow up to the serving version's cursor and
then cuts over (see :meth:`~._shadow.ShadowBuild.build`). With the
``auto`` mode it does so as soon as it is caught up. With ``manual`` (the
contract's ``cutover``, or the host's config) it holds there: it keeps
following the serving version's cursor, reduce only, so that a cutover
asked for later needs no more than a batch or two of work, and it cuts over
only once :meth:`CutoverGate.ask` was called (``streamkit processor
cutover``, the HTTP verb, the admin page's button). Whoever asked gets the
cutover offset, or the error that ended the attempt.

An automatic cutover is *held* (:meth:`CutoverGate.hold`) when the built
version skipped more events than the version it replaces did (see
:meth:`~._shadow.ShadowBuild.build`): it then waits like a manual one,
with the reason in ``status``, until an operator cuts over by hand.

The gate owns the mode, the request and the askers' futures; the shadow
build (:mod:`._shadow`) owns the build.
"""

from __future__ import annotations

import asyncio
import contextlib

from streamkit.contract import CutoverMode

__all__ = ["FOLLOW_EVERY", "CutoverGate"]

FOLLOW_EVERY = 1.0
"""Seconds between two reads of the serving cursor while a manual cutover waits."""


class CutoverGate:
    """The cutover mode of one engine and the operator's request (see the module)."""

    def __init__(self, mode: CutoverMode) -> None:
        self.mode: CutoverMode = mode
        self._asked = asyncio.Event()
        self._askers: list[asyncio.Future[int]] = []
        self.waiting = False
        """True while a built version holds at the serving cursor for an operator's cutover."""
        self.held: str | None = None
        """Why an automatic cutover waits for an operator (None: it is not held)."""

    @property
    def manual(self) -> bool:
        """Whether the cutover waits for an operator: chosen so, or held."""
        return self.mode == "manual" or self.held is not None

    def hold(self, reason: str) -> None:
        """An automatic cutover waits for an operator from now on, for ``reason``."""
        self.held = reason

    @property
    def asked(self) -> bool:
        """Whether an operator asked for the cutover (and it has not failed since)."""
        return self._asked.is_set()

    def ask(self) -> asyncio.Future[int]:
        """Ask for the cutover; the future gets the cutover offset once it committed."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._askers.append(future)
        self._asked.set()
        return future

    async def asked_within(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a request; whether one came."""
        if not self._asked.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._asked.wait(), seconds)
        return self._asked.is_set()

    def done(self, offset: int) -> None:
        """The cutover committed at ``offset``: every asker gets it."""
        self.waiting = False
        askers, self._askers = self._askers, []
        for future in askers:
            if not future.done():
                future.set_result(offset)

    def failed(self, error: BaseException) -> None:
        """The attempt ended without a cutover: the askers get ``error`` (ask again to retry)."""
        self.waiting = False
        self._asked.clear()
        askers, self._askers = self._askers, []
        for future in askers:
            if not future.done():
                future.set_exception(error)
