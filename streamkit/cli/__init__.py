"""The ``streamkit`` command line, and what a package needs to add commands to it.

A package adds commands through the ``streamkit.commands`` entry-point group
(see :mod:`streamkit.cli._plugins`); the helpers below give its commands the
core's behaviour: the same argument rules, the same way to open an existing
log, to find the host serving it and to read a processor's stored state.
"""

from streamkit.cli._args import (
    existing_log,
    host_socket_for,
    positive_int,
    positive_seconds,
    served_log,
    stored_snapshot,
)
from streamkit.cli._main import build_parser, main
from streamkit.cli._plugins import COMMANDS_GROUP

__all__ = [
    "COMMANDS_GROUP",
    "build_parser",
    "existing_log",
    "host_socket_for",
    "main",
    "positive_int",
    "positive_seconds",
    "served_log",
    "stored_snapshot",
]
