"""Random chains over random payloads: every path that folds a mixed-version log agrees.

For a chain of ``k`` versions (each step adds one field with a default) and
a log whose events are stored at random versions of it, the state is the
same whether the log is folded by ``reduce_processor``, caught up by an
engine (a rebuild), or pushed to an engine event by event (the live path),
and equal to the fold of the same log written at the current version.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, create_model
from streamkit.testing import memory_storage, memory_stream, reduce_processor, settle

from streamkit import (
    EventDefinition,
    ProcessorEngine,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
)


class Seen(BaseModel):
    rows: list[dict[str, int]] = []


def chain_processor(k: int) -> StreamProcessor[Seen]:
    """A processor of ``item`` at version ``k``: version j + 1 added field ``f{j}`` (default j)."""
    fields: dict[str, Any] = {"n": (int, ...)}
    fields.update({f"f{j}": (int, ...) for j in range(1, k)})
    model = create_model(f"ItemV{k}", **fields)

    def step(j: int) -> Any:
        return lambda payload: {**payload, f"f{j}": j}

    definition = EventDefinition(
        description="an item",
        payload_schema=model,
        version=k,
        upcasters={j: step(j) for j in range(1, k)},
    )

    class Chained(StreamProcessor[Seen]):
        contract = define_processor_contract(
            slug="chained",
            version="1",
            state_schema=Seen,
            events={"item": definition},
            consumes=["item"],
        )

        def reduce(self, event: StreamEvent, state: Seen) -> Seen:
            assert event.payload_version == k
            return Seen(rows=[*state.rows, event.payload.model_dump()])

    return Chained()


def stored(n: int, version: int, values: list[int]) -> dict[str, Any]:
    """An item as the release of ``version`` wrote it: fields ``f1..f{version-1}`` set."""
    payload = {"n": n, **{f"f{j}": values[j - 1] for j in range(1, version)}}
    return {"type": "item", "payload": payload, "payload_version": version}


def as_current(n: int, version: int, values: list[int], k: int) -> dict[str, Any]:
    """The same item written at version ``k``: the fields added since take their defaults."""
    payload = {"n": n, **{f"f{j}": values[j - 1] if j < version else j for j in range(1, k)}}
    return {"type": "item", "payload": payload, "payload_version": k}


async def engine_states(processor: Any, log: list[dict[str, Any]]) -> tuple[Seen, Seen]:
    """(a rebuild's state, the live path's state) of ``log``."""
    rebuilt_stream = memory_stream()
    await rebuilt_stream.append(*log)
    rebuilt = ProcessorEngine(processor, stream=rebuilt_stream, storage=memory_storage())
    _, rebuild_state = await rebuilt.snapshot()
    await rebuilt.aclose()
    live_stream = memory_stream()
    live = ProcessorEngine(processor, stream=live_stream, storage=memory_storage())
    await live.snapshot()
    live_stream.engines.append(live)
    for event in log:
        await live_stream.append(event)
    await settle()
    _, live_state = await live.snapshot()
    await live.aclose()
    return rebuild_state, live_state


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(min_value=1, max_value=4).flatmap(
        lambda k: st.tuples(
            st.just(k),
            st.lists(
                st.tuples(
                    st.integers(min_value=1, max_value=k),
                    st.lists(st.integers(-9, 9), min_size=k, max_size=k),
                ),
                max_size=12,
            ),
        )
    )
)
def test_every_path_folds_a_mixed_version_log_as_the_current_one(
    case: tuple[int, list[tuple[int, list[int]]]],
) -> None:
    k, items = case
    processor = chain_processor(k)
    mixed = [stored(n, version, values) for n, (version, values) in enumerate(items)]
    current = [as_current(n, version, values, k) for n, (version, values) in enumerate(items)]
    expected = reduce_processor(processor, current)
    assert reduce_processor(processor, mixed) == expected
    rebuild, live = asyncio.run(engine_states(processor, mixed))
    assert rebuild == expected
    assert live == expected
