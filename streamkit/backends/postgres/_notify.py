"""What a PostgreSQL log's commits tell followers: the channel, and the positions published.

Every commit that adds durable events notifies :func:`notify_channel` of its
schema (the writer), and :class:`Fed` records, per followed path, through
which offset commits were published to the feed, by the writer (this
process's commits) and the listener (everyone's).
"""

from __future__ import annotations

import threading

__all__ = ["Fed", "notify_channel"]


def notify_channel(schema: str) -> str:
    """The ``LISTEN`` channel of the log in ``schema`` (within PostgreSQL's 63 bytes)."""
    return f"streamkit_{schema}"[:63]


class Fed:
    """Per followed path, the offset through which its commits were published to the feed.

    Shared by the writer (its own commits) and the listener (everyone's); a
    position only moves forward. Publishing past commits the listener has
    not read yet is safe: a push that starts above a follower's position
    makes it read the gap from the log.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.positions: dict[str, int] = {}

    def advance(self, path: str, through: int) -> None:
        with self.lock:
            fed = self.positions.get(path)
            if fed is not None and through > fed:
                self.positions[path] = through
