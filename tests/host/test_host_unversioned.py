"""A rolling deploy's old producers send the old shape unnamed; test helpers stamp as a host does.

The next release of the board reads ``task.created`` at version 4 (it gained
``due``). An old producer still sends the version-3 shape without naming
it. A host of the new release reads an unnamed payload as its current
version, so that append is refused at the door (nothing written);
``[schema] unversioned = 3`` makes it read as version 3 and lifted. The
first-party client helpers name the version always, and ``reduce_processor``
and ``memory_stream`` stamp an unnamed payload as a host's log does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from streamkit.processors.dlq import replay_requested_event
from streamkit.processors.tasks import task_requested_event
from streamkit.testing import memory_storage, memory_stream, reduce_processor, settle
from support.upcasting import NextTaskBoard, Tasks

from streamkit import InvalidEvent, ProcessorEngine
from streamkit.config import HostConfig
from streamkit.host import ProcessorHost

OLD_SHAPE = {"type": "task.created", "payload": {"title": "a", "priority": 1, "owner": "ana"}}
"""What a producer of the release before writes: version 3, unnamed."""


def host(tmp_path: Path, **config: Any) -> ProcessorHost:
    settings = HostConfig.model_validate({"db": str(tmp_path / "u.db"), **config})
    return ProcessorHost(settings, processors=[NextTaskBoard()], serve_control=False)


async def test_an_unnamed_old_shape_is_refused_unless_the_host_reads_it_as_that_version(
    tmp_path: Path,
) -> None:
    """Unset, the unnamed v3 payload is taken for v4 and refused, nothing written; with
    [schema] unversioned = 3 it is stored as v3 and the board reads it lifted."""
    strict = host(tmp_path)
    await strict.start()
    try:
        with pytest.raises(InvalidEvent, match=r"version 4\) does not fit"):
            await strict.append("/", [OLD_SHAPE])
        assert strict.log is not None
        assert await strict.log.stream("/").head() == 0
    finally:
        await strict.stop()
    rolling = host(tmp_path, schema={"unversioned": 3})
    await rolling.start()
    try:
        (stored,) = await rolling.append("/", [OLD_SHAPE])
        assert stored.payload_version == 3
        # A producer of the new release names its version, and is read as it is.
        (new,) = await rolling.append(
            "/",
            [
                {
                    "type": "task.created",
                    "payload": {"title": "b", "priority": 2, "owner": "bo", "due": "mon"},
                    "payload_version": 4,
                }
            ],
        )
        await rolling.wait_until_processed("task-board", new.offset)
        state = (await rolling.snapshot("task-board"))["state"]
        assert state["titles"] == ["a", "b"]
    finally:
        await rolling.stop()


def test_reduce_processor_stamps_an_unnamed_payload_as_a_host_does() -> None:
    """An unnamed current-shape payload is read as the current version (not lifted as v1);
    unversioned=3 reads the old shape as a rolling host would."""
    current = {
        "type": "task.created",
        "payload": {"title": "a", "priority": 1, "owner": "ana", "due": "mon"},
    }
    assert reduce_processor(NextTaskBoard(), [current]).titles == ["a"]
    assert reduce_processor(NextTaskBoard(), [OLD_SHAPE], unversioned=3) == Tasks(
        titles=["a"], owners=["ana"], priorities=[1]
    )


async def test_memory_stream_stamps_an_unnamed_payload_with_its_engines_contracts() -> None:
    """An engine's contract decides what an unnamed payload is stored as, as a host's does."""
    stream = memory_stream()
    engine = ProcessorEngine(NextTaskBoard(), stream=stream, storage=memory_storage())
    stream.engines.append(engine)
    (stored,) = await stream.append(
        {
            "type": "task.created",
            "payload": {"title": "a", "priority": 1, "owner": "ana", "due": "mon"},
        }
    )
    assert stored.payload_version == 4
    await settle()
    assert (await engine.snapshot()).state.titles == ["a"]
    old = memory_stream(contracts=[NextTaskBoard.contract], unversioned=3)
    (kept,) = await old.append(OLD_SHAPE)
    assert kept.payload_version == 3
    await engine.aclose()


def test_the_client_helpers_name_the_payload_version() -> None:
    """What a first-party helper builds says its version, so a newer host lifts it."""
    assert task_requested_event(task_id="t", name="job")["payload_version"] == 1
    assert replay_requested_event()["payload_version"] == 1
