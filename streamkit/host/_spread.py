"""Sharing the processors among the hosts alive on one log: who should run what.

Every host computes the same answer from the same facts, read from the
store at each heartbeat: the hosts alive (each with the processors it is
configured to run) and who holds each lease now. :func:`assign` gives each
processor one host:

1. a processor stays with the live host that holds it while that host has
   fewer than ``floor(processors / hosts)`` (sticky: a hand-off costs a
   pause, so a balanced placement is never shuffled);
2. every other processor goes to the host able to run it that has the
   fewest so far; of a tie, the one that holds it, else the first by a hash
   of the processor and the host (so the hosts of a tie do not all pick the
   same one).

So no two hosts able to run the same processors differ by more than one.

A host then takes only the free leases assigned to it, and hands off a
processor assigned to another live host (after the batch in flight). The
lease stays the arbiter: two hosts that see the facts differently for a
moment contend for a lease, and one of them wins it; the next heartbeat
agrees again. So nothing here is needed for correctness, only for balance.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

__all__ = ["Key", "assign", "key_of"]

Key = str
"""A processor as hosts name it to each other: ``slug@path``."""


def key_of(slug: str, path: str) -> Key:
    """The key of the processor ``slug`` on ``path``."""
    return f"{slug}@{path}"


def assign(hosts: Mapping[str, Iterable[Key]], holders: Mapping[Key, str]) -> dict[Key, str]:
    """Each processor some live host runs, mapped to the host that should run it.

    ``hosts``: each live host (owner) and the processors it can run;
    ``holders``: who holds each lease now (holders that are not live are
    ignored).
    """
    able: dict[Key, list[str]] = {}
    for owner in sorted(hosts):
        for key in hosts[owner]:
            able.setdefault(key, []).append(owner)
    if not able:
        return {}
    share = len(able) // len(hosts)
    counts = dict.fromkeys(hosts, 0)
    placed: dict[Key, str] = {}
    for key in sorted(able):
        holder = holders.get(key)
        if holder in counts and holder in able[key] and counts[holder] < share:
            placed[key] = holder
            counts[holder] += 1
    for key in sorted(able):
        if key in placed:
            continue
        holder = holders.get(key)
        owner = min(able[key], key=lambda o: (counts[o], o != holder, _tie(key, o)))
        placed[key] = owner
        counts[owner] += 1
    return placed


def _tie(key: Key, owner: str) -> str:
    return hashlib.sha256(f"{key}\n{owner}".encode()).hexdigest()
