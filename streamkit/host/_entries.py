"""What a host runs: each processor with its path, its label and the config's words on it.

:func:`host_entries` builds the list from the config's ``[[processors]]``
(resolved and constructed) or from the processors handed to the host in
code, and refuses two processors of one slug (a slug keys its checkpoint,
its lease and its live state, so two of them would overwrite each other).
Where the config is silent, the contract's word holds (``on_malformed``,
``on_reduce_error``, ``cutover``, ``start``). An entry's ``on_malformed`` and
``on_reduce_error`` are decided here, once, by
:func:`~streamkit.contract.failure_choice`: the entry's word, the
contract's, the config's default for every processor, else ``"stall"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from streamkit.config import HostConfig, ProcessorSpec, resolve_processors, shared_slug
from streamkit.contract import CutoverMode, StartFrom
from streamkit.errors import InvalidConfig
from streamkit.failure_policy import OnMalformed, OnReduceError, failure_choice
from streamkit.processor import StreamProcessor

__all__ = ["Entry", "host_entries"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One processor a host runs: where, under what name, and the config's words on it."""

    processor: StreamProcessor[Any]
    path: str
    label: str
    on_malformed: OnMalformed
    on_reduce_error: OnReduceError
    cutover: CutoverMode | None = None
    start: StartFrom | None = None

    @property
    def starts_from(self) -> StartFrom | None:
        """Where it starts on its path the first time: the config's word, else the contract's."""
        return self.start if self.start is not None else self.processor.contract.start


def host_entries(
    config: HostConfig,
    processors: Iterable[StreamProcessor[Any] | tuple[str, StreamProcessor[Any]]] | None,
) -> list[Entry]:
    """The config's processors, or ``processors`` (each on ``/`` or a ``(path, processor)``)."""
    entries: list[Entry] = []

    def entry(
        processor: StreamProcessor[Any], path: str, label: str, spec: ProcessorSpec | None
    ) -> Entry:
        contract = processor.contract
        return Entry(
            processor,
            path,
            label,
            failure_choice(
                None if spec is None else spec.on_malformed,
                contract.on_malformed,
                config.on_malformed,
            ),
            failure_choice(
                None if spec is None else spec.on_reduce_error,
                contract.on_reduce_error,
                config.on_reduce_error,
            ),
            None if spec is None else spec.cutover,
            None if spec is None else spec.start,
        )

    if processors is None:
        for resolved in resolve_processors(config):
            spec = resolved.spec
            entries.append(entry(resolved.processor, spec.path, spec.label, spec))
    else:
        for item in processors:
            path, processor = item if isinstance(item, tuple) else ("/", item)
            entries.append(entry(processor, path, type(processor).__name__, None))
    _check_entries(entries)
    return entries


def _check_entries(entries: Sequence[Entry]) -> None:
    seen: dict[str, str] = {}
    for entry in entries:
        slug = entry.processor.contract.slug
        if slug in seen:
            raise InvalidConfig(
                shared_slug(slug, seen[slug], entry.path)
                + "; give one of them another slug; nothing was started",
                details={"slug": slug, "paths": [seen[slug], entry.path]},
            )
        seen[slug] = entry.path
