"""What the tests share: processors, rigs, peers and child programs (one home each)."""

import socket
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""
SUPPORT = Path(__file__).resolve().parent
"""This folder (child programs and modules copied into a test's directory live here)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
