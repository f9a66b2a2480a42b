"""Processors and a rig shared by the engine tests (not a test module)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field
from streamkit.testing import ManualClock, MemoryStorage, MemoryStream, settle

from streamkit import (
    EventDefinition,
    ProcessorEngine,
    StreamEvent,
    StreamProcessor,
    define_processor_contract,
)
from streamkit.processor import ProcessEventArgs


class Item(BaseModel):
    n: int


class Note(BaseModel):
    text: str = ""


class Echo(BaseModel):
    n: int


class Tally(BaseModel):
    total: int = 0
    offsets: list[int] = Field(default_factory=list)


CATALOG = {
    "item.added": EventDefinition(description="a number to add", payload_schema=Item),
    "note.made": EventDefinition(description="a note nobody folds", payload_schema=Note),
    "ping": EventDefinition(description="a live poke", payload_schema=Note, ephemeral=True),
    "item.echoed": EventDefinition(description="what the recorder emits", payload_schema=Echo),
}


def recorder_contract(version: str = "1", slug: str = "recorder", *, skip: bool = False) -> Any:
    return define_processor_contract(
        slug=slug,
        version=version,
        description="adds items, records every delivery",
        state_schema=Tally,
        events=CATALOG,
        consumes=["item.added", "ping"],
        emits=["item.echoed"],
        on_malformed="skip" if skip else None,
        on_reduce_error="skip" if skip else None,
    )


Hook = Callable[[ProcessEventArgs[Tally]], None]


class Recorder(StreamProcessor[Tally]):
    """Folds item.added into a total and records every process_event call."""

    contract = recorder_contract()

    def __init__(self, on_event: Hook | None = None) -> None:
        self.on_event = on_event
        self.calls: list[tuple[int | None, bool]] = []
        self.payloads: list[Any] = []

    def reduce(self, event: StreamEvent, state: Tally) -> Tally | None:
        if event.type == "item.added":
            return Tally(
                total=state.total + event.payload.n, offsets=[*state.offsets, event.offset]
            )
        return None

    def process_event(self, args: ProcessEventArgs[Tally]) -> None:
        event = args.event
        self.calls.append((None if event is None else event.offset, args.delivery.caught_up))
        if event is not None:
            self.payloads.append(event.payload)
        if self.on_event is not None:
            self.on_event(args)

    @property
    def delivered(self) -> list[int]:
        return [offset for offset, _ in self.calls if offset is not None]


class SkippingRecorder(Recorder):
    """A Recorder whose contract chose to skip what it cannot fold (malformed, or a raising reduce)."""

    contract = recorder_contract(skip=True)


def item(n: int, **extra: Any) -> dict[str, Any]:
    return {"type": "item.added", "payload": {"n": n}, **extra}


def note(text: str = "x") -> dict[str, Any]:
    return {"type": "note.made", "payload": {"text": text}}


def ping(text: str = "x") -> dict[str, Any]:
    return {"type": "ping", "payload": {"text": text}, "ephemeral": True}


class Rig:
    """A memory stream, a memory storage, a manual clock, and the engines built over them."""

    def __init__(self) -> None:
        self.stream = MemoryStream("/")
        self.storage = MemoryStorage()
        self.clock = ManualClock()
        self.built: list[ProcessorEngine[Any]] = []

    def engine(
        self, processor: StreamProcessor[Any], *, pushed: bool = True, **kwargs: Any
    ) -> ProcessorEngine[Any]:
        engine: ProcessorEngine[Any] = ProcessorEngine(
            processor, stream=self.stream, storage=self.storage, clock=self.clock, **kwargs
        )
        self.built.append(engine)
        if pushed:
            self.stream.engines.append(engine)
        return engine

    def restart(
        self, old: ProcessorEngine[Any], processor: StreamProcessor[Any]
    ) -> ProcessorEngine[Any]:
        if old in self.stream.engines:
            self.stream.engines.remove(old)
        return self.engine(processor)

    def checkpoint(self, slug: str = "recorder") -> Any:
        return self.storage.read(slug)

    def deltas(self) -> list[dict[str, Any]]:
        return [
            e.payload for e in self.stream.pushed_events if e.type == "streamkit.live-state-changed"
        ]

    async def close(self) -> None:
        await settle(0)
        for engine in self.built:
            await engine.aclose()
        self.storage.close()
