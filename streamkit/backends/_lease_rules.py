"""What every backend's lease statements offer, and the rules that do not depend on storage.

A backend keeps leases with the statements of :class:`LeaseRows`, each
on the connection it is given (the host store's transactions, the keeper's
own connection). Every backend's statements check their arguments with
:func:`check_names` and :func:`check_time` before any SQL, and explain a
lost lease with :func:`lease_lost`, built from the row they find stored,
so the message a host logs is the same whichever backend it runs on.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from streamkit._requests import Connection
from streamkit.errors import InvalidRequest, LeaseLost
from streamkit.protocols import RELEASED, Lease, LeaseAsk

__all__ = ["LeaseRows", "check_names", "check_time", "lease_lost"]


class LeaseRows(Protocol):
    """A backend's lease statements, one row per ``(path, slug)`` (the rules: ``sqlite.leases``)."""

    def read_lease(self, conn: Connection, path: str, slug: str) -> Lease | None:
        """The stored row of ``(path, slug)``, or None if nobody ever held it."""
        ...

    def try_acquire(self, conn: Connection, ask: LeaseAsk) -> Lease | None:
        """ONE conditional statement: the lease taken for ``owner``, or None (nothing changed)."""
        ...

    def take_over(
        self, conn: Connection, path: str, slug: str, owner: str, now: float, ttl: float
    ) -> Lease:
        """Take ``(path, slug)``'s lease at the next generation, whoever holds it (cutover only)."""
        ...

    def renew(self, conn: Connection, lease: Lease, now: float, ttl: float) -> Lease:
        """Extend ``lease`` under its generation; LeaseLost (nothing changed) if it is not ours."""
        ...

    def check_fence(self, conn: Connection, lease: Lease, now: float) -> None:
        """Inside a write transaction: LeaseLost unless ``lease`` is the stored, unexpired row."""
        ...

    def release(self, conn: Connection, lease: Lease) -> bool:
        """Give ``lease`` up if still ours (its row and generation stay); whether it was."""
        ...


def lease_lost(
    lease: Lease, now: float, attempt: str, stored: tuple[str, int, float] | None
) -> LeaseLost:
    """Why ``lease`` no longer holds, given the stored ``(owner, generation, expires_at)``."""
    details: dict[str, Any] = {
        "path": lease.path,
        "slug": lease.slug,
        "owner": lease.owner,
        "generation": lease.generation,
        "now": now,
        "holder": None,
        "holder_generation": None,
        "holder_expires_at": None,
    }
    if stored is None:
        now_held = "the lease row is gone"
    else:
        holder, generation, expires_at = stored
        details.update(
            holder=holder,
            holder_generation=generation,
            holder_expires_at=None if expires_at == RELEASED else expires_at,
        )
        if (holder, generation) != (lease.owner, lease.generation):
            state = "holds" if now < expires_at else "last held"
            now_held = f"{holder!r} {state} it at generation {generation}"
        elif expires_at == RELEASED:
            now_held = "this holder released it"
        else:
            now_held = f"it expired at {expires_at} (now is {now}) and nobody took it yet"
    outcome = (
        "the lease was not renewed"
        if attempt == "renew"
        else "nothing was written by this transaction"
    )
    return LeaseLost(
        f"lease lost for processor {lease.slug!r} at path {lease.path!r}: owner {lease.owner!r} "
        f"held generation {lease.generation}, but {now_held}; {outcome}; stop this "
        "processor's engine here, then either leave the processor to the current holder or "
        "take the lease again with try_acquire and rebuild the engine from its checkpoint",
        details=details,
    )


def check_names(path: object, slug: object, owner: object) -> None:
    for name, value in (("path", path), ("slug", slug), ("owner", owner)):
        if not isinstance(value, str) or not value:
            raise InvalidRequest(
                f"lease {name} must be a non-empty string, got {value!r}; nothing was written",
                details={name: repr(value)[:200]},
            )


def check_time(now: object, ttl: object) -> None:
    for name, value in (("now", now), ("ttl", ttl)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise InvalidRequest(
                f"lease {name} must be a finite number of seconds, got {value!r}; nothing was "
                "written",
                details={name: repr(value)[:200]},
            )
    if isinstance(ttl, int | float) and ttl <= 0:
        raise InvalidRequest(
            f"lease ttl must be > 0 seconds, got {ttl!r}; nothing was written",
            details={"ttl": ttl},
        )
