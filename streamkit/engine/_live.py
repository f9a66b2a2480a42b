"""Publishing an engine's live state: after each batch, or only while someone wants it.

The half of :class:`~streamkit.engine.ProcessorEngine` (which inherits it)
that turns the reduced state into live-state deltas. After each batch the
engine asks ``publish_live`` (``True``, ``False`` or a callable) whether to
project: when it says no, nothing is projected, diffed or appended, and the
live state only falls behind. The first batch published once it says yes
again sends one delta from the last revision sent; a seed taken meanwhile
(``live_snapshot``) adopts the present as a new revision without a delta.
A projection that raises costs only its notification, and the next seed
tries again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

from streamkit.events import StreamEvent
from streamkit.live_state import LiveSnapshot, LiveState
from streamkit.processor import StreamProcessor

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["LivePublishing"]

S = TypeVar("S")


class LivePublishing(Generic[S]):
    """The live-state half of :class:`~streamkit.engine.ProcessorEngine` (which inherits it).

    The attributes below are the engine's; they are named here so each
    method's use of them is checked.
    """

    _processor: StreamProcessor[S]
    _state: S
    _live: LiveState[Any] | None
    _live_behind: bool
    _publish_live: bool | Callable[[], bool]

    if TYPE_CHECKING:

        def _swallowed(self, what: str, exc: BaseException, event: StreamEvent | None) -> None: ...

    def publish_live_state(self) -> None:
        """Re-project the state and send a live-state delta if the projection changed.

        The engine calls this after every batch; a host calls it when a runtime
        field of the processor changed outside a batch. While ``publish_live``
        says no, it only notes that the live state is behind. A projection that
        raises costs only this notification. Before the checkpoint is loaded
        there is nothing to publish.
        """
        if self._live is None:
            return
        if not self._live_wanted():
            self._live_behind = True
            return
        self._project_live()

    @property
    def live_behind(self) -> bool:
        """Whether batches ran unpublished since the last delta (``publish_live`` said no)."""
        return self._live_behind

    def _live_wanted(self) -> bool:
        wanted = self._publish_live
        if isinstance(wanted, bool):
            return wanted
        try:
            return bool(wanted())
        except Exception as exc:
            self._swallowed("processor.publish_live_failed", exc, None)
            return True

    def _project_live(self, *, rebase: bool = False) -> LiveSnapshot:
        """Project the state now and hand it to the live state: a delta if it changed.

        With ``rebase`` the projection is adopted without a delta (the revision
        still moves if it changed), for a seed taken while the live state lagged.
        """
        live = self._live
        assert live is not None
        try:
            projection = self._processor.project_live_state(self._state)
        except Exception as exc:
            self._swallowed("processor.projection_failed", exc, None)
            self._live_behind = True  # the next seed tries again
            return live.snapshot()
        self._live_behind = False
        if rebase:
            return live.rebase(projection)
        live.set(projection)
        return live.snapshot()
