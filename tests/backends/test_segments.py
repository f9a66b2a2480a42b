"""Archive segments (streamkit.backends._retention.segments): written whole, read back, proven, chained."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamkit import open_log
from streamkit.backends._retention.segments import (
    archive_page,
    check_chain,
    check_segment,
    read_segment,
    segment_name,
    write_segment,
)
from streamkit.backends._stored import Row, decode_rows

NOW = "2026-12-05T00:00:00Z"

text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=20)
row_bodies = st.tuples(
    st.sampled_from(["order.placed", "x"]),
    text.map(lambda t: json.dumps({"t": t})),
    st.just("{}"),
    st.none() | st.just('{"processor":{"slug":"p"}}'),
    st.none() | text,
    st.just(NOW),
    st.integers(1, 3),
)


def rows_at(offsets: list[int], bodies: list[tuple[object, ...]]) -> list[Row]:
    return [(o, *b) for o, b in zip(offsets, bodies, strict=False)]  # type: ignore[misc]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.integers(1, 10_000), min_size=1, max_size=30, unique=True).map(sorted),
    st.lists(row_bodies, min_size=30, max_size=30),
)
def test_rows_come_back_exactly_and_in_pages(
    tmp_path_factory: pytest.TempPathFactory, offsets: list[int], bodies: list[tuple[object, ...]]
) -> None:
    rows = rows_at(offsets, bodies)
    folder = tmp_path_factory.mktemp("segments")
    segment = write_segment(folder, "/orders", 1, offsets[-1] + 5, rows, None, NOW)
    assert (segment.first, segment.last, segment.count) == (1, offsets[-1] + 5, len(rows))
    assert read_segment(segment.file) == rows
    middle = offsets[len(offsets) // 2]
    assert (
        read_segment(segment.file, after=middle, limit=3) == [r for r in rows if r[0] > middle][:3]
    )
    assert check_segment(segment) is None
    assert list(folder.iterdir()) == [Path(segment.file)]  # no partial file left


async def test_a_log_s_rows_decode_from_a_segment_as_from_the_log(tmp_path: Path) -> None:
    """The archived rows of a real log give the very events a read of the log gives."""
    db = tmp_path / "app.db"
    async with open_log(db) as log:
        await log.stream("/orders").append(
            {"type": "order.placed", "payload": {"n": 1, "note": "é"}, "idempotency_key": "k1"},
            {"type": "order.shipped", "payload": {"n": 1}, "metadata": {"by": "ops"}},
        )
        live = (await log.stream("/orders").read(0, 10)).events
    with closing(sqlite3.connect(db)) as conn:
        stored = conn.execute(
            'SELECT "offset", type, payload, metadata, source, idempotency_key, created_at,'
            " coalesce(payload_version, 1) FROM streamkit_events WHERE path = '/orders'"
            ' ORDER BY "offset"'
        ).fetchall()
    segment = write_segment(tmp_path / "archive", "/orders", 1, 2, stored, None, NOW)
    assert list(decode_rows("/orders", read_segment(segment.file))) == list(live)


def test_a_changed_truncated_or_missing_file_is_named(tmp_path: Path) -> None:
    rows: list[Row] = [
        (1, "x", "{}", "{}", None, None, NOW, 1),
        (2, "x", "{}", "{}", None, None, NOW, 1),
    ]
    segment = write_segment(tmp_path, "/", 1, 2, rows, None, NOW)
    data = bytearray(Path(segment.file).read_bytes())
    data[len(data) // 2] ^= 0x01
    Path(segment.file).write_bytes(bytes(data))
    assert "was changed after it was written" in (check_segment(segment) or "")
    Path(segment.file).write_bytes(bytes(data[:-10]))
    assert f"recorded as {segment.bytes}" in (check_segment(segment) or "")
    Path(segment.file).unlink()
    assert "is missing" in (check_segment(segment) or "")


def test_a_record_the_file_does_not_match_is_named(tmp_path: Path) -> None:
    """The right bytes under another record (its range, its link): the manifest says so."""
    rows: list[Row] = [(5, "x", "{}", "{}", None, None, NOW, 1)]
    segment = write_segment(tmp_path, "/", 5, 5, rows, "ab" * 32, NOW)
    assert "disagrees with its record on prev_sha256" in (
        check_segment(replace(segment, prev_sha256=None)) or ""
    )


def test_the_chain_must_follow_on_and_link(tmp_path: Path) -> None:
    one = write_segment(tmp_path, "/", 1, 2, [(1, "x", "{}", "{}", None, None, NOW, 1)], None, NOW)
    two = write_segment(
        tmp_path, "/", 3, 4, [(3, "x", "{}", "{}", None, None, NOW, 1)], one.sha256, NOW
    )
    assert check_chain([two, one]) == []
    broken = replace(two, prev_sha256="00" * 32)
    assert "names 0000" in check_chain([one, broken])[0]
    overlapping = replace(two, first=1)
    assert any("overlap" in p for p in check_chain([one, overlapping]))
    assert "not recorded" in check_chain([two])[0]


@pytest.mark.parametrize(
    ("first", "last", "rows"),
    [
        (
            1,
            5,
            [(2, "x", "{}", "{}", None, None, NOW, 1), (1, "x", "{}", "{}", None, None, NOW, 1)],
        ),
        (3, 5, [(2, "x", "{}", "{}", None, None, NOW, 1)]),
        (5, 4, []),
    ],
    ids=["unordered", "outside", "no-range"],
)
def test_a_segment_of_rows_out_of_order_or_range_is_refused(
    tmp_path: Path, first: int, last: int, rows: list[Row]
) -> None:
    with pytest.raises(ValueError, match="segment"):
        write_segment(tmp_path, "/", first, last, rows, None, NOW)
    assert list(tmp_path.iterdir()) == []


def test_a_range_of_no_events_is_a_segment_too(tmp_path: Path) -> None:
    """Offsets taken by ephemerals only: the archive still says the range holds nothing."""
    empty = write_segment(tmp_path, "/", 1, 3, [], None, NOW)
    assert (empty.count, read_segment(empty.file), check_segment(empty)) == (0, [], None)
    page = archive_page([empty], "/", 0, 10, None)
    assert page is not None
    assert (list(page.events), page.scanned_through_offset, page.at_head) == ([], 3, False)


def test_archive_pages_walk_the_segments_and_stop_at_a_gap(tmp_path: Path) -> None:
    rows: list[Row] = [(o, "x", "{}", "{}", None, None, NOW, 1) for o in (1, 2, 4)]
    one = write_segment(tmp_path, "/", 1, 4, rows, None, NOW)
    two = write_segment(
        tmp_path, "/", 5, 6, [(6, "x", "{}", "{}", None, None, NOW, 1)], one.sha256, NOW
    )
    full = archive_page([one, two], "/", 0, 2, None)
    assert full is not None
    assert ([e.offset for e in full.events], full.scanned_through_offset) == ([1, 2], 2)
    rest = archive_page([one, two], "/", 2, 10, None)
    assert rest is not None
    assert ([e.offset for e in rest.events], rest.scanned_through_offset) == ([4], 4)
    bounded = archive_page([one, two], "/", 4, 10, 5)
    assert bounded is not None
    assert (
        [e.offset for e in bounded.events],
        bounded.scanned_through_offset,
        bounded.at_head,
    ) == (
        [],
        5,
        True,
    )
    # A range deleted without an archive (7..9) lies between two and a later segment.
    three = write_segment(
        tmp_path, "/", 10, 10, [(10, "x", "{}", "{}", None, None, NOW, 1)], two.sha256, NOW
    )
    assert archive_page([one, two, three], "/", 6, 10, None) is None


def test_names_tell_paths_apart_and_sort_by_range() -> None:
    assert segment_name("/a_b", 1, 9) != segment_name("/a/b", 1, 9)
    names = [segment_name("/o", f, f + 9) for f in (1, 100, 20)]
    assert sorted(names) == [segment_name("/o", f, f + 9) for f in (1, 20, 100)]
