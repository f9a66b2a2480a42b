"""The retention horizon, holds and forgetting, as every backend's HostStore keeps them.

Written against :class:`~streamkit.protocols.HostStore` alone (the ``store``
fixture runs it over every backend): a checkpoint saved through a host's
fenced storage carries its path and what its state needs, and the horizon
of each path is the least need; holds and forgetting are audited verbs that
write their record and a ``streamkit.`` control event together or not at all.
"""

from __future__ import annotations

import time

import pytest

from streamkit.errors import InvalidRequest, NotFound
from streamkit.holds import HOLD_PLACED, HOLD_RELEASED, PROCESSOR_FORGOTTEN, check_hold
from streamkit.horizon import Horizon
from streamkit.host._lease_keeper import HeldLease
from streamkit.log import Log
from streamkit.protocols import CheckpointStorage, HostStore, LeaseAsk

# On a private in-memory log too: these tests keep to the one log they open.
ALSO_IN_MEMORY = True

TTL = 60.0


async def fenced(store: HostStore, path: str, slug: str) -> CheckpointStorage:
    lease = await store.try_acquire(LeaseAsk(path, slug, "owner", time.time(), TTL))
    assert lease is not None
    held = HeldLease(
        lease, store.check_fence, ttl=TTL, renewal_started=time.monotonic(), clock=time.time
    )
    return store.checkpoints(held, path)


async def fill(log: Log, path: str, count: int) -> None:
    await log.stream(path).append(*({"type": "n", "payload": {"i": i}} for i in range(count)))


def of(horizons: list[Horizon], path: str) -> Horizon:
    (found,) = [h for h in horizons if h.path == path]
    return found


async def test_a_path_with_nothing_known_keeps_nothing(log: Log, store: HostStore) -> None:
    """Events no processor and no hold knows of: the horizon is past the head."""
    await fill(log, "/free", 5)
    horizon = of(await store.retention.horizons(time.time()), "/free")
    assert (horizon.head, horizon.offset, horizon.needs) == (5, 6, ())


async def test_the_horizon_is_the_least_need_of_every_version_and_names_it(
    log: Log, store: HostStore
) -> None:
    """Cursor + 1, a lagging state's offset + 1 and retain_from: the least wins, named."""
    await fill(log, "/orders", 40)
    await fill(log, "/other", 3)
    board = await fenced(store, "/orders", "board")
    await board.save("board", reducer_version="1", reduced_through_offset=30, state_json="{}")
    horizon = of(await store.retention.horizons(time.time()), "/orders")
    assert (horizon.offset, [(n.name, n.why) for n in horizon.held_by]) == (
        31,
        [("board@1", "cursor")],
    )
    await board.save(
        "board", reducer_version="1", reduced_through_offset=35, state_json=None, state_offset=20
    )
    assert of(await store.retention.horizons(time.time()), "/orders").offset == 21
    await board.save(
        "board", reducer_version="1", reduced_through_offset=36, state_json="{}", retain_from=7
    )
    horizon = of(await store.retention.horizons(time.time()), "/orders")
    assert (horizon.offset, horizon.held_by[0].why) == (7, "retain_from")
    # A shadow version of another processor on the path holds from its own cursor.
    audit = await fenced(store, "/orders", "audit")
    await audit.save("audit", reducer_version="2", reduced_through_offset=3, state_json="{}")
    horizon = of(await store.retention.horizons(time.time()), "/orders")
    assert (horizon.offset, horizon.held_by[0].name) == (4, "audit@2")
    # Rows of /orders hold nothing on /other.
    assert of(await store.retention.horizons(time.time()), "/other").offset == 4


async def test_an_offline_processor_holds_its_history(log: Log, store: HostStore) -> None:
    """A processor whose host is gone (its lease released) still holds from its cursor."""
    await fill(log, "/", 10)
    board = await fenced(store, "/", "board")
    await board.save("board", reducer_version="1", reduced_through_offset=4, state_json="{}")
    lease = await store.read_lease("/", "board")
    assert lease is not None
    await store.release(lease)
    assert of(await store.retention.horizons(time.time()), "/").offset == 5


async def test_a_processor_a_host_runs_without_a_checkpoint_holds_everything(
    log: Log, store: HostStore
) -> None:
    """Registered as run on the path but never checkpointed: it starts at the beginning."""
    await fill(log, "/jobs", 4)
    await store.host_beat("host-a", ["mailer@/jobs"], time.time())
    horizon = of(await store.retention.horizons(time.time()), "/jobs")
    assert (horizon.offset, [(n.kind, n.name) for n in horizon.held_by]) == (
        1,
        [("unstarted", "mailer")],
    )


async def test_a_hold_is_placed_and_released_with_its_control_events(
    log: Log, store: HostStore
) -> None:
    """Each verb writes its row and its event at once; the horizon follows the hold."""
    await fill(log, "/", 20)
    now = time.time()
    hold = check_hold("/", "audit-2026", 3, None, "ops@example", "the auditors read it", now)
    placed = await store.retention.place_hold(hold)
    assert (placed.type, placed.payload) == (
        HOLD_PLACED,
        {
            "name": "audit-2026",
            "from": 3,
            "until": None,
            "by": "ops@example",
            "reason": hold.reason,
        },
    )
    horizon = of(await store.retention.horizons(now), "/")
    assert [(n.kind, n.name, n.from_offset) for n in horizon.held_by] == [("hold", "audit-2026", 3)]
    with pytest.raises(InvalidRequest, match="already on"):
        await store.retention.place_hold(check_hold("/", "audit-2026", 9, None, "x", "again", now))
    released = await store.retention.release_hold(
        "/", "audit-2026", by="ops@example", reason="done"
    )
    assert (released.type, released.payload["from"]) == (HOLD_RELEASED, 3)
    assert of(await store.retention.horizons(now), "/").needs == ()
    with pytest.raises(NotFound):
        await store.retention.release_hold("/", "audit-2026", by="ops@example", reason="twice")
    types = [e.type for e in (await log.stream("/").read(20, 10)).events]
    assert types == [HOLD_PLACED, HOLD_RELEASED]  # the refusals wrote nothing


async def test_an_expired_hold_holds_nothing(log: Log, store: HostStore) -> None:
    """A hold with an end holds until then, and not after."""
    await fill(log, "/", 5)
    now = time.time()
    await store.retention.place_hold(check_hold("/", "week", 2, now + 100, "ops", "a week", now))
    assert of(await store.retention.horizons(now), "/").offset == 2
    later = of(await store.retention.horizons(now + 101), "/")
    assert (later.offset, later.needs) == (later.head + 1, ())


@pytest.mark.parametrize(
    ("name", "offset", "until", "by", "reason"),
    [
        ("", 1, None, "ops", "why"),
        ("x" * 101, 1, None, "ops", "why"),
        ("ok", 0, None, "ops", "why"),
        ("ok", True, None, "ops", "why"),
        ("ok", 1, 10.0, "ops", "why"),  # in the past
        ("ok", 1, None, "", "why"),
        ("ok", 1, None, "ops", " "),
    ],
)
def test_a_malformed_hold_is_refused_before_anything_is_written(
    name: str, offset: int, until: float | None, by: str, reason: str
) -> None:
    """Every part of a hold is checked; the refusal says nothing was written."""
    with pytest.raises(InvalidRequest, match="nothing was written"):
        check_hold("/", name, offset, until, by, reason, time.time())


async def test_forgetting_a_processor_deletes_its_rows_with_a_record(
    log: Log, store: HostStore
) -> None:
    """Its rows go (the horizon moves on), with one event listing what each version needed."""
    await fill(log, "/orders", 10)
    board = await fenced(store, "/orders", "board")
    await board.save(
        "board", reducer_version="1", reduced_through_offset=6, state_json="{}", retain_from=2
    )
    now = time.time()
    forgot = await store.retention.forget_processor(
        "board", None, by="ops", reason="removed in release 9", now=now, ttl=TTL
    )
    assert forgot.type == PROCESSOR_FORGOTTEN
    assert forgot.path == "/orders"
    assert forgot.payload["versions"] == [
        {"version": "1", "path": "/orders", "cursor": 6, "needed_from": 2, "serving": True}
    ]
    assert of(await store.retention.horizons(now), "/orders").needs == ()
    assert await board.load("board") is None
    with pytest.raises(NotFound):
        await store.retention.forget_processor(
            "board", None, by="ops", reason="again", now=now, ttl=TTL
        )


async def test_a_processor_a_live_host_runs_is_not_forgotten(log: Log, store: HostStore) -> None:
    """Its next checkpoint would write the row again: refused, nothing written."""
    await fill(log, "/", 3)
    board = await fenced(store, "/", "board")
    await board.save("board", reducer_version="1", reduced_through_offset=2, state_json="{}")
    now = time.time()
    await store.host_beat("host-a", ["board@/"], now)
    with pytest.raises(InvalidRequest, match="host-a"):
        await store.retention.forget_processor(
            "board", None, by="ops", reason="r", now=now, ttl=TTL
        )
    assert await board.load("board") is not None
    assert (await log.stream("/").head()) == 3
