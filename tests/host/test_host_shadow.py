"""A rolling deploy of a changed processor: the new version builds in the shadow, then cuts over.

Two hosts on one log, over every backend. Host ``a`` runs version 1 of a
processor with effects; host ``b`` starts with version 2 while a producer
appends. Version 1 keeps serving (effects and all) while ``b`` builds
version 2 under a shadow lease of its own; at version 1's cursor one
transaction records the cutover, fences version 1 (its lease moves to
``b`` at the next generation) and makes version 2 serving. Host ``a`` then
leaves the processor alone (its version is retired). Every item has exactly
one effect, version 2 delivers only the events after the cutover offset,
and its state is what a fresh replay gives.
"""

from __future__ import annotations

import asyncio
import io
import time
from dataclasses import replace
from typing import Any

import pytest
from support.backends import Target
from support.host import Effector, EffectorV2, ManualEffectorV2

from streamkit import open_log
from streamkit.backends import host_store
from streamkit.backends._fenced_checkpoints import FencedCheckpoints
from streamkit.checkpoint import CUTOVER_EVENT
from streamkit.cli import main
from streamkit.cli._host_commands import _phase_text
from streamkit.config import HostConfig
from streamkit.errors import InvalidRequest
from streamkit.host import ProcessorHost
from streamkit.web._metrics import exposition


def config(target: Target) -> HostConfig:
    return HostConfig.model_validate(
        {
            "db": target.target,
            "lease": {"ttl": 1.0, "heartbeat": 0.1},
            "shutdown_grace": 1.0,
        }
    )


async def until(check: Any, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def everything(target: Target) -> list[Any]:
    async with open_log(target.target) as log:
        events: list[Any] = []
        after = 0
        while True:
            page = await log.stream("/").read(after, 5000)
            events.extend(page.events)
            if page.at_head or page.scanned_through_offset <= after:
                return events
            after = page.scanned_through_offset


async def test_a_new_version_builds_beside_the_serving_one_and_cuts_over_once(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The shadow waits at its first target until the producer is done, so that version 1
    # is seen serving (effects and all) all through the build.
    gate = asyncio.Event()
    fence_serving = FencedCheckpoints.fence_serving

    async def gated(self: FencedCheckpoints, slug: str) -> None:
        await gate.wait()
        await fence_serving(self, slug)

    monkeypatch.setattr(FencedCheckpoints, "fence_serving", gated)
    old_processor, new_processor = Effector(), EffectorV2()
    old = ProcessorHost(config(target), processors=[old_processor], serve_control=False, owner="a")
    new = ProcessorHost(config(target), processors=[new_processor], serve_control=False, owner="b")
    try:
        await old.start()
        async with open_log(target.target) as log:
            stream = log.stream("/")
            first = await stream.append(
                *({"type": "item", "payload": {"n": 1}} for _ in range(300))
            )
            appended = [event.offset for event in first]
            await old.wait_until_processed("effector", appended[-1], timeout=30)
            await new.start()
            runner = new.runner("effector")
            await until(lambda: runner.engine is not None and runner.role.shadow)
            for n in range(40):  # a producer appends while version 2 builds
                batch = await stream.append(
                    *({"type": "item", "payload": {"n": n}} for _ in range(5))
                )
                appended.extend(event.offset for event in batch)
                await asyncio.sleep(0.01)
            await old.wait_until_processed("effector", appended[-1], timeout=30)
            assert old.runner("effector").engine is not None  # version 1 serves all along
            shadow = (await new.status())["processors"][0]
            assert (shadow["phase"], shadow["serving_version"]) == ("rebuilding", "1")
            assert shadow["shadow_lease"]["owner"] == "b"
            assert shadow["lease"]["owner"] == "a"
            # The row is what clients are served: version 1's cursor and lag; the build's
            # own position is its progress.
            # (Its durable checkpoint: version 1's engine may be past it over events it
            # does not consume, which move its cursor without a write.)
            serving = (await old.status())["processors"][0]
            assert appended[-1] <= shadow["cursor"] <= serving["cursor"]
            assert 0 <= shadow["lag"] <= shadow["head"] - shadow["cursor"]
            assert shadow["progress"]["target"] <= serving["cursor"]
            assert shadow["unserved"] is None
            assert "(version 1 serves meanwhile)" in _phase_text(shadow)
            gate.set()
            await until(lambda: runner.engine is not None and not runner.role.shadow)
            await until(lambda: old.runner("effector").state == "retired")
            last = await stream.append(*({"type": "item", "payload": {"n": 7}} for _ in range(3)))
            appended.extend(event.offset for event in last)
        await new.wait_until_processed("effector", appended[-1], timeout=30)
        await asyncio.sleep(0.2)  # the effects of the last batch land

        events = await everything(target)
        items = [e for e in events if e.type == "item"]
        assert [e.offset for e in items] == appended
        (cutover,) = [e for e in events if e.type == CUTOVER_EVENT]
        cut = cutover.payload["offset"]
        assert cutover.payload == {
            "slug": "effector",
            "from_version": "1",
            "to_version": "2",
            "offset": cut,
        }
        assert appended[-4] <= cut < appended[-3]  # where version 1 stood when fenced
        # Exactly one effect per item, each by the version serving its offset.
        effects = {e.payload["source"]: e.payload["version"] for e in events if e.type == "effect"}
        assert sorted(effects) == appended
        assert len([e for e in events if e.type == "effect"]) == len(appended)
        assert {o: v for o, v in effects.items() if v == "2"} == {
            o: "2" for o in appended if o > cut
        }
        assert sorted(new_processor.delivered) == [o for o in appended if o > cut]
        # Its state is what a replay of every item under version 2 gives.
        snapshot = await new.snapshot("effector")
        assert snapshot["state"] == {
            "total": 10 * sum(e.payload["n"] for e in items),
            "items": len(items),
        }
        async with open_log(target.target) as log:
            serving, retired = await host_store(log).version_rows("effector", "1")
        assert serving is not None
        assert retired is not None
        assert (serving.reducer_version, serving.cutover_offset) == ("2", cut)
        assert (retired.serving, retired.retired_at, retired.reduced_through_offset) == (
            False,
            cut,
            cut,
        )
        status = await old.status()
        (row,) = status["processors"]
        assert (row["state"], row["retired"]) == ("retired", {"serving": "2", "retired_at": cut})
        assert row["lease_held_here"] is False
        assert old.log is not None
        scraped = exposition(
            status, follow_age=None, log_stats=old.log.stats, lag_seconds={}, histograms={}
        ).decode()
        assert 'streamkit_processor_retired{path="/",slug="effector"} 1.0' in scraped
        (served,) = (await new.status())["processors"]
        assert (served["version"], served["serving_version"], served["phase"]) == (
            "2",
            "2",
            "serving",
        )
        assert served["lease"]["owner"] == "b"
        assert served["shadow_lease"]["expires_at"] is None  # released by the cutover
    finally:
        await new.stop(grace=0.0)
        await old.stop(grace=0.0)


async def test_a_rollback_makes_the_replaced_version_serve_again_from_its_kept_row(
    target: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a cutover to 2, `processor rollback --to 1`: the host still running 1 builds it
    from its kept row up to 2's cursor and cuts back; no effect runs twice, none is missed."""
    old_processor, new_processor = Effector(), EffectorV2()
    old = ProcessorHost(config(target), processors=[old_processor], serve_control=False, owner="a")
    new = ProcessorHost(config(target), processors=[new_processor], serve_control=False, owner="b")
    try:
        await old.start()
        async with open_log(target.target) as log:
            stream = log.stream("/")
            appended = [e.offset for e in await stream.append(*(item(1) for _ in range(100)))]
            await old.wait_until_processed("effector", appended[-1], timeout=30)
            await new.start()
            await until(lambda: new.runner("effector").state == "running")
            await until(lambda: not new.runner("effector").role.shadow)
            await until(lambda: old.runner("effector").state == "retired")
            appended += [e.offset for e in await stream.append(*(item(2) for _ in range(20)))]
            await new.wait_until_processed("effector", appended[-1], timeout=30)

            out = io.StringIO()
            versions = ["processor", "versions", "effector", "--db", target.target]
            assert await asyncio.to_thread(main, versions, out=out) == 0
            lines = out.getvalue().splitlines()
            assert lines[0].startswith("effector  v2  serving  cursor=")
            assert lines[1].startswith("effector  v1  retired  cursor=")
            rollback = ["processor", "rollback", "effector", "--to", "1", "--db", target.target]
            assert await asyncio.to_thread(main, rollback, out=io.StringIO()) == 0
            await until(lambda: new.runner("effector").state == "retired")
            await until(lambda: not old.runner("effector").role.shadow)
            appended += [e.offset for e in await stream.append(*(item(3) for _ in range(5)))]
            await old.wait_until_processed("effector", appended[-1], timeout=30)
            capsys.readouterr()
            assert await asyncio.to_thread(main, rollback, out=io.StringIO()) == 1  # serves already
            assert "serves already; nothing was changed" in capsys.readouterr().err
        await asyncio.sleep(0.2)  # the effects of the last batch land

        events = await everything(target)
        cutovers = [e.payload for e in events if e.type == CUTOVER_EVENT]
        assert [(c["from_version"], c["to_version"]) for c in cutovers] == [("1", "2"), ("2", "1")]
        first_cut, back = cutovers[0]["offset"], cutovers[1]["offset"]
        effects = {e.payload["source"]: e.payload["version"] for e in events if e.type == "effect"}
        assert len([e for e in events if e.type == "effect"]) == len(appended)
        assert sorted(effects) == appended
        assert effects == {o: "1" if o <= first_cut or o > back else "2" for o in appended}
        assert not [o for o in old_processor.delivered if first_cut < o <= back]
        snapshot = await old.snapshot("effector")
        items = [e for e in events if e.type == "item"]
        assert snapshot["state"] == {
            "total": sum(e.payload["n"] for e in items),
            "items": len(items),
        }
    finally:
        await new.stop(grace=0.0)
        await old.stop(grace=0.0)


def item(n: int) -> dict[str, Any]:
    return {"type": "item", "payload": {"n": n}}


class SameStateV2(Effector):
    """A version 2 that changes nothing the state shows (a fix to effects, say)."""

    contract = EffectorV2.contract


@pytest.mark.parametrize("factor", [10, 1])
async def test_a_watcher_of_the_live_state_is_re_seeded_with_the_new_version_at_cutover(
    target: Target, monkeypatch: pytest.MonkeyPatch, factor: int
) -> None:
    """A client watching on the host that cuts over gets a fresh seed from the new version's
    engine: the state version 2 reduced, with no event needed after the cutover, also when
    version 2's state equals version 1's (no delta would tell the watcher anything)."""
    gate = asyncio.Event()
    fence_serving = FencedCheckpoints.fence_serving

    async def gated(self: FencedCheckpoints, slug: str) -> None:
        await gate.wait()
        await fence_serving(self, slug)

    monkeypatch.setattr(FencedCheckpoints, "fence_serving", gated)
    old = ProcessorHost(config(target), processors=[Effector()], serve_control=False, owner="a")
    version2 = EffectorV2() if factor == 10 else SameStateV2()
    new = ProcessorHost(config(target), processors=[version2], serve_control=False, owner="b")
    messages: list[dict[str, Any]] = []

    async def watching() -> None:
        async for message in new.watch("effector"):
            messages.append(message)

    try:
        await old.start()
        async with open_log(target.target) as log:
            appended = await log.stream("/").append(*(item(2) for _ in range(50)))
        await old.wait_until_processed("effector", appended[-1].offset, timeout=30)
        await new.start()
        runner = new.runner("effector")
        await until(lambda: runner.engine is not None and runner.role.shadow)
        watcher = asyncio.ensure_future(watching())
        try:
            await asyncio.sleep(0.2)
            gate.set()
            await until(lambda: runner.engine is not None and not runner.role.shadow)
            v2 = {"total": factor * 2 * 50, "items": 50}
            await until(
                lambda: any(
                    m["kind"] == "seed" and m["rev"] != 0 and m["state"] == v2 for m in messages
                )
            )
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        assert messages[0]["kind"] == "seed"
        assert messages[0]["state"] == {"total": 2 * 50, "items": 50}  # version 1's, meanwhile
        seeds = [m["rev"] for m in messages if m["kind"] == "seed"]
        assert len(seeds) == len(set(seeds))  # no revision is seeded twice
    finally:
        await new.stop(grace=0.0)
        await old.stop(grace=0.0)


async def test_a_renewal_that_finds_the_shadow_lease_released_by_its_own_cutover_is_no_loss(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cutover's transaction releases the shadow lease; the lease keeper, renewing it
    before the engine has heard the commit back, finds it released by this very holder.
    That is the cutover landing, not a lost lease: the operator who asked gets the cutover's
    offset, and no failure is recorded. (Seen in CI: `processor cutover` answered
    LEASE_LOST for a cutover that had committed.)"""
    cut_over = FencedCheckpoints.cut_over

    async def heard_late(self: FencedCheckpoints, slug: str, **fields: Any) -> None:
        exchange = self._exchange
        assert exchange is not None
        told: list[tuple[Any, float]] = []
        self._exchange = replace(
            exchange, taken=lambda lease, started: told.append((lease, started))
        )
        try:
            await cut_over(self, slug, **fields)
        finally:
            self._exchange = exchange
        # Committed: several heartbeats renew the shadow lease before the engine goes on.
        await asyncio.sleep(0.6)
        exchange.taken(*told[0])

    monkeypatch.setattr(FencedCheckpoints, "cut_over", heard_late)
    old = ProcessorHost(config(target), processors=[Effector()], serve_control=False, owner="a")
    new = ProcessorHost(
        config(target), processors=[ManualEffectorV2()], serve_control=False, owner="b"
    )
    try:
        await old.start()
        async with open_log(target.target) as log:
            stream = log.stream("/")
            appended = [e.offset for e in await stream.append(*(item(1) for _ in range(50)))]
            await old.wait_until_processed("effector", appended[-1], timeout=30)
            await new.start()
            runner = new.runner("effector")
            await until(lambda: runner.engine is not None and runner.role.shadow)
            answer = None
            deadline = time.monotonic() + 30
            while answer is None:
                try:
                    answer = await new.cut_over("effector", timeout=30)
                except InvalidRequest:  # not built yet
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
            assert answer["version"] == "2"
            assert answer["from_version"] == "1"
            (cutover,) = [e for e in await everything(target) if e.type == CUTOVER_EVENT]
            assert answer["offset"] == cutover.payload["offset"]
            await until(lambda: runner.engine is not None and not runner.role.shadow)
            more = [e.offset for e in await stream.append(*(item(2) for _ in range(5)))]
            await new.wait_until_processed("effector", more[-1], timeout=30)
            (served,) = (await new.status())["processors"]
            assert (served["version"], served["phase"]) == ("2", "serving")
            assert served["last_error"] is None
    finally:
        await new.stop(grace=0.0)
        await old.stop(grace=0.0)
