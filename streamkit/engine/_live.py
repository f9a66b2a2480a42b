"""An engine's live state: projected after each batch, or only while someone wants it.

A :class:`LiveProjection` turns the engine's reduced state into live-state
deltas. After each batch the engine hands it the state; it asks
``publish_live`` (``True``, ``False`` or a callable) whether to project: when
the answer is no, nothing is projected, diffed or appended, and the live
state only falls behind. The first publish once it says yes again sends one
delta from the last revision sent; a seed taken meanwhile
(:meth:`LiveProjection.snapshot`) adopts the present as a new revision
without a delta. A projection that raises costs only its notification, and
the next seed tries again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from streamkit.events import StreamEvent
from streamkit.live_state import LiveSnapshot, LiveState
from streamkit.processor import StreamProcessor
from streamkit.protocols import ProcessorStream

__all__ = ["LiveProjection"]

S = TypeVar("S")

Swallowed = Callable[[str, BaseException, StreamEvent | None], None]


class LiveProjection(Generic[S]):
    """The live state of one engine's processor (see the module docstring).

    Nothing is published before :meth:`start` (the engine calls it once its
    checkpoint is loaded).
    """

    def __init__(
        self,
        processor: StreamProcessor[S],
        wanted: bool | Callable[[], bool],
        swallowed: Swallowed,
    ) -> None:
        self._processor = processor
        self._wanted = wanted
        self._swallowed = swallowed
        self._live: LiveState[Any] | None = None
        # A publish was skipped (nobody wanted it): the live state lags the state.
        self._behind = False

    @property
    def behind(self) -> bool:
        """Whether batches ran unpublished since the last delta (``publish_live`` said no)."""
        return self._behind

    def start(self, stream: ProcessorStream, slug: str, state: S) -> None:
        """Seed the live state with the projection of ``state``, where the engine starts from.

        After a version bump that is the old version's state, so the
        re-reduce publishes the one delta that heals clients of the old
        projection. Unwanted, it is not projected at all: the first publish
        then sends the whole value.
        """
        seed = None
        if self.wanted():
            try:
                seed = self._processor.project_live_state(state)
            except Exception as exc:
                self._swallowed("processor.projection_failed", exc, None)
        else:
            self._behind = True
        self._live = LiveState(stream, slug, seed)

    def publish(self, state: S) -> None:
        """Project ``state`` and send a delta if the projection changed, if anyone wants it."""
        if self._live is None:
            return
        if not self.wanted():
            self._behind = True
            return
        self._project(state)

    def snapshot(self, state: S) -> LiveSnapshot:
        """``(rev, projection)`` for a seed: a lagging live state adopts ``state`` without a delta."""
        live = self._live
        assert live is not None  # the engine loads its checkpoint before it asks
        if self._behind:
            return self._project(state, rebase=True)
        return live.snapshot()

    def wanted(self) -> bool:
        """What ``publish_live`` says now; a callable that raises counts as yes."""
        wanted = self._wanted
        if isinstance(wanted, bool):
            return wanted
        try:
            return bool(wanted())
        except Exception as exc:
            self._swallowed("processor.publish_live_failed", exc, None)
            return True

    async def drain(self) -> None:
        """Wait for the deltas sent so far to reach the stream."""
        if self._live is not None:
            await self._live.drain()

    def _project(self, state: S, *, rebase: bool = False) -> LiveSnapshot:
        live = self._live
        assert live is not None
        try:
            projection = self._processor.project_live_state(state)
        except Exception as exc:
            self._swallowed("processor.projection_failed", exc, None)
            self._behind = True  # the next seed tries again
            return live.snapshot()
        self._behind = False
        if rebase:
            return live.rebase(projection)
        live.set(projection)
        return live.snapshot()
