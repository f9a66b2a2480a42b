"""The data check before a deploy: can this code read everything the log stores?

:func:`check_processor` takes a processor's contract and the path it reads
and judges every (type, payload version) stored there that the contract
reads (under its current name or a former one), from the log's summary of
stored types (``Log.stored_types``): one small read, whatever the log's
size. Each stored key is one of

- ``current``: stored at the version the code reads;
- ``lifted``: older, and the definition's upcasters reach the current
  version from it;
- ``ahead``: newer than the code knows: the processor would stall there
  (``SCHEMA_AHEAD``) until a host with newer code takes it;
- ``no_chain``: older than the oldest upcaster: every such event would be
  skipped as malformed (or stall the processor, with ``on_malformed =
  "stall"``).

That is the cheap half, and what a host runs at start (``schema_check`` in
its config). With ``validate="all"`` (or a sample of N per key) the stored
payloads themselves go through the chain and the model, as the fold would
read them: the exact count that would be skipped, the first offsets and
the first reason, and how many the readers DROP. The summary is compared
with the log's head too: a summary behind the log (a writer of an earlier
release appended after the upgrade) is reported, never trusted silently.

Nothing here writes. A problem is a key that would be skipped or would
stall, or a summary that cannot be trusted; ``streamkit schema check``
exits non-zero when any processor has one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from streamkit._event_builders import failure_text
from streamkit.contract import EventDefinition, ProcessorContract
from streamkit.errors import HistoryTruncated, LogTampered, StorageError
from streamkit.events import ReadPage
from streamkit.failure_policy import OnMalformed, failure_choice
from streamkit.protocols import StreamAccess
from streamkit.records import StoredType
from streamkit.upcasting import DROP, upcast

__all__ = [
    "Outcome",
    "ProcessorCheck",
    "StoredVerdict",
    "check_processor",
    "parse_validate",
    "problems_of",
]

Outcome = Literal["current", "lifted", "ahead", "no_chain"]

FIRST_OFFSETS = 5
"""How many offsets of events that would be skipped a verdict names."""

_PAGE = 1000

PageSource = Callable[[int, int], Awaitable[ReadPage]]
"""``read(after, limit)``: a page of a stream's durable events (see :func:`check_processor`)."""


@dataclass(frozen=True, slots=True)
class StoredVerdict:
    """One stored (type, version) a processor reads, and what its code does with it."""

    stored: StoredType
    reads_as: str
    """The type's current name (differs from ``stored.type`` for a renamed type)."""
    current_version: int
    outcome: Outcome
    validated: int = 0
    """Stored payloads pushed through chain and model (0 without validation)."""
    skipped: int = 0
    """Of those, how many the processor would skip as malformed (or stall at)."""
    dropped: int = 0
    """Of those, how many its upcasters DROP (read as nothing, on purpose)."""
    first_skipped: tuple[int, ...] = ()
    why: str | None = None
    """Why the first of them would be skipped."""
    unchecked: tuple[tuple[int, int], ...] = ()
    """Ranges of this key's offsets that could not be validated: history retention took
    whose archive cannot be read (deleted, or its files gone). A rebuild cannot read them
    either."""

    @property
    def problem(self) -> bool:
        """Whether some of these events would be skipped or would stall the processor."""
        return self.outcome in ("ahead", "no_chain") or self.skipped > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.stored.to_dict(),
            "reads_as": self.reads_as,
            "current_version": self.current_version,
            "outcome": self.outcome,
            "problem": self.problem,
            "validated": self.validated,
            "skipped": self.skipped,
            "dropped": self.dropped,
            "first_skipped": list(self.first_skipped),
            "why": self.why,
            "unchecked": [list(r) for r in self.unchecked],
        }

    def describe(self, on_malformed: OnMalformed) -> str:
        """One line for people: the key, its events, and what the code does with them."""
        s = self.stored
        name = s.type if s.type == self.reads_as else f"{s.type} (now {self.reads_as})"
        head = f"{name} v{s.version}: {s.count} events ({s.first_offset}..{s.last_offset})"
        wrong = "stall at" if on_malformed == "stall" else "be skipped, from"
        if self.outcome == "ahead":
            what = (
                f"AHEAD: this code reads v{self.current_version}; the processor stalls at "
                f"{s.first_offset} (SCHEMA_AHEAD) until newer code runs it"
            )
        elif self.outcome == "no_chain":
            what = (
                f"NO CHAIN: no upcaster from v{s.version} to v{self.current_version}; "
                f"every one would {wrong} {s.first_offset}"
            )
        elif self.outcome == "lifted":
            what = f"lifted to v{self.current_version}"
        else:
            what = "current"
        if self.validated:
            what += f"; validated {self.validated}"
            if self.dropped:
                what += f", {self.dropped} dropped by the upcasters"
            if self.skipped and on_malformed == "stall":
                what += (
                    f", {self.skipped} malformed: the processor would stall at "
                    f"{self.first_skipped[0]} ({self.why})"
                )
            elif self.skipped:
                offsets = ", ".join(str(o) for o in self.first_skipped)
                what += f", {self.skipped} would be skipped (first: {offsets}): {self.why}"
        if self.unchecked:
            gone = ", ".join(f"{a}..{b}" for a, b in self.unchecked)
            what += f"; NOT CHECKED: {gone} (taken by retention, and no archive of it is readable)"
        return f"{head}: {what}"


@dataclass(frozen=True, slots=True)
class ProcessorCheck:
    """What one processor's code makes of what its path stores."""

    slug: str
    path: str
    on_malformed: OnMalformed
    verdicts: tuple[StoredVerdict, ...]
    validation: str
    """``"none"``, ``"all"`` or ``"sample=N"``."""
    head: int
    """The path's durable head when checked."""
    summary_through: int
    """The last offset the summary counts on the path (``head`` when it is current)."""

    @property
    def summary_behind(self) -> bool:
        """Whether the log holds events past what its summary counts (see the module)."""
        return self.summary_through < self.head

    @property
    def problems(self) -> list[StoredVerdict]:
        return [verdict for verdict in self.verdicts if verdict.problem]

    @property
    def ok(self) -> bool:
        return not self.problems and not self.summary_behind

    def to_dict(self) -> dict[str, Any]:
        return {
            "slug": self.slug,
            "path": self.path,
            "on_malformed": self.on_malformed,
            "validation": self.validation,
            "ok": self.ok,
            "head": self.head,
            "summary_through": self.summary_through,
            "summary_behind": self.summary_behind,
            "stored": [verdict.to_dict() for verdict in self.verdicts],
        }

    def behind_text(self) -> str:
        """What a summary behind its log means, and the way out (see :attr:`summary_behind`)."""
        return (
            f"SUMMARY BEHIND: the log's head is {self.head} but its summary of stored "
            f"types counts through {self.summary_through} (a writer of an earlier release "
            "appended after the upgrade); run `streamkit schema recount`, then check again"
        )

    def lines(self) -> list[str]:
        """The check for people: a heading, then one line per stored key."""
        verdict = "ok" if self.ok else f"{len(self.problems)} problem(s)"
        out = [f"{self.slug} on {self.path} (on_malformed={self.on_malformed}): {verdict}"]
        if self.summary_behind:
            out.append(f"  {self.behind_text()}")
        if not self.verdicts:
            out.append("  (nothing stored that this processor reads)")
        for item in self.verdicts:
            mark = "!" if item.problem else " "
            out.append(f" {mark} {item.describe(self.on_malformed)}")
        return out


def parse_validate(value: str | None) -> int | Literal["all"] | None:
    """``--validate``: ``all``, ``sample=N`` (N per stored key) or None; ValueError otherwise."""
    if value is None or value == "none":
        return None
    if value == "all":
        return "all"
    if value.startswith("sample="):
        number = value.removeprefix("sample=")
        if number.isdigit() and int(number) > 0:
            return int(number)
    raise ValueError(f"expected 'all' or 'sample=N' (N at least 1), got {value!r}")


async def check_processor(
    contract: ProcessorContract[Any],
    stream: StreamAccess,
    stored: Sequence[StoredType],
    head: int,
    *,
    on_malformed: OnMalformed | None = None,
    validate: int | Literal["all"] | None = None,
    scan_limit: int | None = None,
    read: PageSource | None = None,
) -> ProcessorCheck:
    """Judge every key of ``stored`` that ``contract`` reads (see the module).

    ``stored`` is the summary of the stream's path (``log.stored_types(path)``)
    and ``head`` its durable head, read BEFORE it: the summary moves in the
    commit that adds rows, so a summary read after the head counts at least
    through it unless rows were written without it. ``stream`` is read only
    to validate. ``on_malformed`` overrides the contract's choice (as a host's
    config does); ``validate`` is ``"all"``, N (payloads per stored key) or None;
    ``scan_limit`` bounds the events read per key while looking for them (a host's
    check at start: a rare type spread over a long log is validated on what that
    scan met, and its verdict says how many). ``read(after, limit)`` reads a page
    as a rebuild does, through the archive (a log's ``Stream.read`` with
    ``include_archive=True``); without it ``stream.read``. A range retention
    deleted (not archived) is skipped and named in the verdict's ``unchecked``.
    """
    path = stream.path
    through = max((row.last_offset for row in stored), default=0)
    renames = contract.renames()
    verdicts: list[StoredVerdict] = []
    for row in stored:
        current = renames.get(row.type, row.type)
        definition = contract.definition_for(current)
        if definition is None:
            continue
        verdict = _judge(row, current, definition)
        if validate is not None and verdict.outcome in ("current", "lifted"):
            verdict = await _validate(
                stream, read or stream.read, verdict, definition, validate, scan_limit
            )
        verdicts.append(verdict)
    return ProcessorCheck(
        slug=contract.slug,
        path=path,
        on_malformed=failure_choice(on_malformed, contract.on_malformed),
        verdicts=tuple(verdicts),
        validation=(
            "none" if validate is None else "all" if validate == "all" else f"sample={validate}"
        ),
        head=head,
        summary_through=through,
    )


def _judge(row: StoredType, current: str, definition: EventDefinition) -> StoredVerdict:
    version = definition.version
    outcome: Outcome
    if row.version > version:
        outcome = "ahead"
    elif row.version == version:
        outcome = "current"
    elif all(step in definition.upcasters for step in range(row.version, version)):
        outcome = "lifted"
    else:
        outcome = "no_chain"
    return StoredVerdict(row, current, version, outcome)


async def _validate(
    stream: StreamAccess,
    read: PageSource,
    verdict: StoredVerdict,
    definition: EventDefinition,
    validate: int | Literal["all"],
    scan_limit: int | None = None,
) -> StoredVerdict:
    """Push the stored payloads of one key through chain and model, as the fold reads them."""
    row = verdict.stored
    wanted = row.count if validate == "all" else min(validate, row.count)
    after = row.first_offset - 1
    seen = skipped = dropped = scanned = 0
    first: list[int] = []
    why: str | None = None
    unchecked: list[tuple[int, int]] = []
    while seen < wanted and after < row.last_offset:
        try:
            page = await read(after, _PAGE)
        except LogTampered:
            raise  # an archive that does not match its record is never passed over
        except (HistoryTruncated, StorageError):
            # What retention took and no archive gives back, no rebuild reads either:
            # named and passed over, if the plain read says the path starts later.
            start = await _start_after(stream, after)
            if start is None:
                raise
            unchecked.append((after + 1, min(start - 1, row.last_offset)))
            after = start - 1
            continue
        for event in page.events:
            if event.type != row.type or event.payload_version != row.version:
                continue
            seen += 1
            problem = _read_fails(event.payload, verdict, definition)
            if problem is DROP:
                dropped += 1
            elif problem is not None:
                skipped += 1
                if len(first) < FIRST_OFFSETS:
                    first.append(event.offset)
                why = why or str(problem)
            if seen >= wanted:
                break
        scanned += len(page.events)
        if page.at_head or not page.events:
            break
        if scan_limit is not None and scanned >= scan_limit:
            break
        after = page.scanned_through_offset
    return dataclasses.replace(
        verdict,
        validated=seen,
        skipped=skipped,
        dropped=dropped,
        first_skipped=tuple(first),
        why=why,
        unchecked=tuple(unchecked),
    )


async def _start_after(stream: StreamAccess, after: int) -> int | None:
    """The path's first offset still held, when it lies past ``after``; else None."""
    try:
        await stream.read(after, 1)
    except HistoryTruncated as exc:
        return int(exc.details["start"])
    return None


def _read_fails(
    payload: dict[str, Any] | None, verdict: StoredVerdict, definition: EventDefinition
) -> object:
    """None if the fold would read it, DROP if its upcasters drop it, else why it would skip it."""
    try:
        lifted = upcast(
            verdict.reads_as,
            {} if payload is None else payload,
            verdict.stored.version,
            verdict.current_version,
            definition.upcasters,
        )
        if lifted is DROP:
            return DROP
        definition.payload_schema.model_validate(lifted)
    except Exception as exc:  # an upcaster's own failure is a skip too, as in the fold
        return failure_text(exc)
    return None


def problems_of(checks: Sequence[ProcessorCheck]) -> int:
    """How many problems the checks found (keys, plus each summary behind its log)."""
    return sum(len(check.problems) + check.summary_behind for check in checks)
