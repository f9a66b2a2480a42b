"""The horizon rule alone (streamkit.horizon): the least need of everything known on a path."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamkit.backends._retention.rules import RetentionFacts, horizon_in
from streamkit.horizon import CheckpointNeed, Hold, horizon_of, needs_of

PATHS = ["/", "/a", None]


rows = st.builds(
    CheckpointNeed,
    path=st.sampled_from(PATHS),
    slug=st.sampled_from(["p", "q", "r"]),
    version=st.sampled_from(["1", "2"]),
    cursor=st.integers(0, 100),
    state_offset=st.none() | st.integers(0, 100),
    retain_from=st.none() | st.integers(0, 120),
    serving=st.booleans(),
    retired_at=st.none() | st.integers(0, 100),
)
holds = st.builds(
    Hold,
    path=st.sampled_from(["/", "/a"]),
    name=st.sampled_from(["h1", "h2"]),
    from_offset=st.integers(1, 120),
    until=st.none() | st.floats(0, 200),
    placed_by=st.just("ops"),
    reason=st.just("why"),
    placed_at=st.just(0.0),
)


@given(
    st.lists(rows, max_size=6),
    st.lists(holds, max_size=3),
    st.lists(st.sampled_from(["p", "s"]), max_size=2),
    st.integers(0, 100),
)
def test_the_horizon_is_the_least_need_on_the_path_and_nothing_else(
    found: list[CheckpointNeed], placed: list[Hold], running: list[str], head: int
) -> None:
    now = 100.0
    horizon = horizon_of("/", head, found, placed, running, now)
    mine = [r for r in found if r.path in ("/", None)]
    expected = [head + 1]
    for row in mine:
        need = row.cursor + 1
        if row.state_offset is not None:
            need = min(need, row.state_offset + 1)
        if row.retain_from is not None:
            need = min(need, row.retain_from)
        expected.append(max(1, need))
    expected += [
        h.from_offset for h in placed if h.path == "/" and (h.until is None or now < h.until)
    ]
    if set(running) - {r.slug for r in mine}:
        expected.append(1)
    assert horizon.offset == min(expected)
    assert all(need.from_offset >= horizon.offset for need in horizon.needs)
    assert bool(horizon.held_by) == (horizon.offset <= head)
    assert [n.from_offset for n in horizon.needs] == sorted(n.from_offset for n in horizon.needs)


def test_each_need_is_named_for_its_least_reason_and_state() -> None:
    """The cursor, a lagging state or retain_from; serving, shadow or retired."""
    row = CheckpointNeed("/", "p", "1", 10, None, None, True, None)
    assert (needs_of(row).from_offset, needs_of(row).why, needs_of(row).state) == (
        11,
        "cursor",
        "serving",
    )
    lagging = CheckpointNeed("/", "p", "2", 10, 4, None, False, None)
    assert (needs_of(lagging).from_offset, needs_of(lagging).why, needs_of(lagging).state) == (
        5,
        "state",
        "shadow",
    )
    kept = CheckpointNeed("/", "p", "0", 10, 4, 0, False, 7)
    assert (needs_of(kept).from_offset, needs_of(kept).why, needs_of(kept).state) == (
        1,
        "retain_from",
        "retired",
    )


def test_a_need_below_the_paths_start_never_holds_the_horizon_below_it() -> None:
    """A shadow row left at offset 0 over history that was deleted through 20: the horizon
    stands at the path's start (21), the row is still listed, as abandoned."""
    shadow = CheckpointNeed(
        path="/",
        slug="p",
        version="2",
        cursor=0,
        state_offset=None,
        retain_from=None,
        serving=False,
        retired_at=None,
    )
    serving = CheckpointNeed(
        path="/",
        slug="p",
        version="1",
        cursor=40,
        state_offset=None,
        retain_from=None,
        serving=True,
        retired_at=None,
    )
    facts = RetentionFacts(
        heads=[("/", 40)],
        rows=[shadow, serving],
        holds=[],
        running=[],
        starts={"/": 21},
        archived={},
        windows={},
    )
    horizon = horizon_in(facts, "/", 0.0)
    assert (horizon.start, horizon.offset) == (21, 21)
    assert [need.name for need in horizon.needs] == ["p@2", "p@1"]
    # The shadow row can never be built from there: it is shown as abandoned, and holds
    # nothing (the horizon stands at the path's start, with nothing holding it there).
    assert [need.state for need in horizon.needs] == ["abandoned", "serving"]
    assert horizon.held_by == ()
    assert horizon.to_dict()["needs"][0]["state"] == "abandoned"
