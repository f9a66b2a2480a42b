"""A new contract version builds in the shadow, resumes after a crash, and cuts over once.

The serving version's checkpoint row stays as it was while the new version
reduces the log up to its cursor (reduce only: no ``process_event``, no
effect); the shadow checkpoints its own row as it goes, so an engine that
died mid-way resumes there rather than at 0; at the serving cursor one
cutover makes the new version serving, and its effects run for the events
after that offset only. The replaced row is kept: the old version, deployed
again, resumes from it and cuts back over the same way.
"""

from __future__ import annotations

from typing import Any

import pytest
import structlog
from streamkit.testing import settle
from support.engine import Recorder, Rig, Tally, item, recorder_contract
from support.waits import until

from streamkit import StreamEvent
from streamkit.checkpoint import ReduceCheckpoint
from streamkit.engine import _pages, _rebuild
from streamkit.engine._pages import PAGE_SIZE
from streamkit.errors import StorageError, VersionRetired


class Doubler(Recorder):
    """Version 2 of the recorder: every item counts double."""

    contract = recorder_contract(version="2")

    def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
        return Tally(
            total=state.total + 2 * event.payload.n, offsets=[*state.offsets, event.offset]
        )


async def checkpointed(rig: Rig, appended: list[StreamEvent]) -> None:
    """Wait until the serving checkpoint covers the events just ``appended``."""
    last = appended[-1].offset
    await until(lambda: (rig.checkpoint() or NONE).reduced_through_offset >= last)


NONE = ReduceCheckpoint("none", 0, None)
"""What a slug with no checkpoint yet reads as, to the wait above."""


def rebuild_logs(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"].startswith("processor.rebuild.")]


async def test_a_new_version_builds_in_the_shadow_and_cuts_over_at_the_serving_cursor(
    rig: Rig,
) -> None:
    first = rig.engine(Recorder())
    await checkpointed(rig, await rig.stream.append(*(item(1) for _ in range(30))))
    served = rig.checkpoint().reduced_through_offset
    assert first.processor.delivered[-1] == served  # type: ignore[attr-defined]

    doubler = Doubler()
    second = rig.restart(first, doubler)
    assert (await second.snapshot()).state.total == 60
    assert doubler.delivered == []  # every event up to the cutover had its effects under 1
    assert rig.storage.read("recorder") == ReduceCheckpoint(
        "2", served, rig.storage.read("recorder", "2").state_json, cutover_offset=served
    )
    assert rig.storage.read("recorder", "1") == ReduceCheckpoint(
        "1", served, rig.storage.read("recorder", "1").state_json, serving=False, retired_at=served
    )

    [later] = await rig.stream.append(item(5))
    await until(lambda: doubler.delivered == [later.offset])
    assert later.offset > served
    assert doubler.delivered == [later.offset]  # effects resume after the cutover offset only
    assert (await second.snapshot()).state.total == 70


async def test_a_rebuild_that_died_mid_way_resumes_from_the_shadow_s_own_checkpoint(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = rig.engine(Recorder())
    items = PAGE_SIZE * 4
    await checkpointed(rig, await rig.stream.append(*(item(1) for _ in range(items))))
    target = rig.checkpoint().reduced_through_offset

    # The shadow checkpoints after every page; its third read fails like a lost disk.
    monkeypatch.setattr(_rebuild, "CHECKPOINT_EVERY", 0.0)
    read = _pages.PageReader.read
    reads: list[int] = []

    async def failing(self: Any, after: int, limit: int) -> Any:
        reads.append(after)
        if len(reads) >= 3:  # and stays away: a retry of the dying engine gets no further
            raise StorageError("the disk went away (a test's failure)")
        return await read(self, after, limit)

    monkeypatch.setattr(_pages.PageReader, "read", failing)
    dying = rig.restart(first, Doubler())
    with pytest.raises(StorageError):
        await dying.snapshot()
    resumed_at = rig.storage.read("recorder", "2").reduced_through_offset
    # Two reads were reduced and saved before the failure: the third began where they ended.
    assert 0 < reads[1] < resumed_at == reads[2]
    assert rig.storage.read("recorder").reducer_version == "1"  # still serving

    # The dying engine is gone (as its process would be): nothing of it may retry the
    # rebuild once reads work again, beside the engine that resumes it.
    await dying.aclose()
    monkeypatch.setattr(_pages.PageReader, "read", read)
    with structlog.testing.capture_logs() as logs:
        doubler = Doubler()
        again = rig.restart(dying, doubler)
        assert (await again.snapshot()).state.total == 2 * items
    started, done = rebuild_logs(logs)[0], rebuild_logs(logs)[-1]
    assert (started["event"], started["resumed_at"], started["target"]) == (
        "processor.rebuild.started",
        resumed_at,
        target,
    )
    assert done["event"] == "processor.rebuild.done"
    assert done["events"] == target - resumed_at  # not one event of the first two pages again
    assert doubler.delivered == []
    assert rig.storage.read("recorder").reducer_version == "2"


async def test_a_replaced_version_stands_aside_until_a_rollback_reinstates_it(rig: Rig) -> None:
    """Deployed again, version 1 refuses (VersionRetired); reinstated, it resumes from its row."""
    first = rig.engine(Recorder())
    await checkpointed(rig, await rig.stream.append(*(item(1) for _ in range(10))))
    second = rig.restart(first, Doubler())
    await second.snapshot()
    cut = rig.checkpoint().reduced_through_offset
    await checkpointed(rig, await rig.stream.append(*(item(1) for _ in range(5))))
    served = rig.checkpoint().reduced_through_offset
    assert rig.checkpoint().reducer_version == "2"

    refused = rig.restart(second, Recorder())
    with pytest.raises(VersionRetired) as retired:
        await refused.snapshot()
    assert retired.value.retryable is False
    assert f"replaced by version '2' at offset {cut}" in retired.value.message
    assert "streamkit processor rollback recorder --to 1" in retired.value.message
    assert rig.checkpoint().reducer_version == "2"  # nothing was written

    assert rig.storage.reinstate("recorder", "1")
    assert not rig.storage.reinstate("recorder", "1")  # once
    with structlog.testing.capture_logs() as logs:
        recorder = Recorder()
        back = rig.restart(refused, recorder)
        assert (await back.snapshot()).state.total == 15
    started = rebuild_logs(logs)[0]
    assert (started["resumed_at"], started["target"]) == (cut, served)
    assert rebuild_logs(logs)[-1]["events"] == 5  # only what version 2 served meanwhile
    assert recorder.delivered == []  # their effects ran under version 2
    assert rig.checkpoint() == ReduceCheckpoint(
        "1", served, rig.checkpoint().state_json, cutover_offset=served
    )
    assert rig.storage.read("recorder", "2").retired_at == served


async def test_a_fresh_slug_serves_its_first_version_without_a_rebuild(rig: Rig) -> None:
    with structlog.testing.capture_logs() as logs:
        recorder = Recorder()
        engine = rig.engine(recorder)
        await rig.stream.append(item(2))
        await settle()
        assert (await engine.snapshot()).state.total == 2
    assert rebuild_logs(logs) == []
    assert recorder.delivered == [1]
    assert rig.checkpoint().reducer_version == "1"
    assert rig.checkpoint().serving
