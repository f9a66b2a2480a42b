"""Commands that packages add to ``streamkit``: the ``streamkit.commands`` entry-point group.

An entry point of the group names a callable taking the parser's subcommand
action (``register(sub)``), which adds one or more commands the way the core
ones are added. The first-party processors register theirs so (``streamkit
tasks``, ``streamkit dlq``); the core command line never imports them.

Plugins load in the order of their entry-point names, so ``--help`` is stable.
A plugin that fails to load is reported on stderr, once, and left out: a broken
extra never takes the core commands down with it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import TextIO

__all__ = ["COMMANDS_GROUP", "add_plugin_commands"]

COMMANDS_GROUP = "streamkit.commands"

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def add_plugin_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], *, err: TextIO | None = None
) -> list[str]:
    """Add every registered plugin's commands to ``sub``; return the names of those loaded."""
    loaded: list[str] = []
    found: list[EntryPoint] = sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name)
    for point in found:
        try:
            register: Register = point.load()
            register(sub)
        except Exception as exc:  # a broken plugin must not break the core commands
            (err or sys.stderr).write(
                f"streamkit: the command plugin {point.name!r} ({point.value}) failed to load "
                f"and was left out: {type(exc).__name__}: {exc}\n"
            )
            continue
        loaded.append(point.name)
    return loaded
