"""The code of docs/live-state.md, block by block, as one program.

Generated from the page by scripts/docs_examples.py; do not edit. Run it
from any directory (it writes its files there):

    python examples/docs/live-state.py
"""

import asyncio


async def main() -> None:
    # --- docs/live-state.md:49
    import json

    from streamkit import LIVE_STATE_CHANGED, LiveState, apply_delta


    class CollectingSink:
        """A stand-in for a stream: keeps every appended event in a list."""

        def __init__(self):
            self.events = []

        def append(self, *events):
            self.events.extend(events)


    class Client:
        """A watcher that follows one LiveState by its deltas."""

        def __init__(self, live):
            self.live = live
            self.reseeds = 0
            self.reseed()

        def reseed(self):
            rev, state = self.live.snapshot()
            # What a remote client receives is JSON, so keep the JSON form.
            self.rev, self.state = rev, json.loads(json.dumps(state))
            self.reseeds += 1

        def on_event(self, event):
            payload = event["payload"]
            if event["type"] != LIVE_STATE_CHANGED or payload["key"] != self.live.key:
                return
            if payload["to"] <= self.rev:
                return
            if payload["from"] == self.rev and payload["patch"] is not None:
                self.state = apply_delta(self.state, payload["patch"])
                self.rev = payload["to"]
            else:
                self.reseed()


    sink = CollectingSink()
    board = LiveState(sink, "task-board", {"open": [], "done": 0})
    client = Client(board)

    board.set({"open": ["write docs"], "done": 0})
    board.set({"open": ["write docs", "ship"], "done": 0})
    board.set({"open": ["ship"], "done": 1})

    for event in sink.events:
        client.on_event(event)

    assert client.state == {"open": ["ship"], "done": 1}
    assert client.rev == board.snapshot().rev
    assert client.reseeds == 1  # only the initial seed
    assert sink.events[0]["ephemeral"] is True
    assert sink.events[0]["payload"]["patch"] == [
        {"op": "add", "path": "/open/0", "value": "write docs"}
    ]
    # --- docs/live-state.md:115
    rev_before = board.snapshot().rev
    count_before = len(sink.events)

    board.set({"done": 1, "open": ["ship"]})  # equal JSON, other key order
    board.set(board.get())  # the same object

    assert board.snapshot().rev == rev_before
    assert len(sink.events) == count_before
    # --- docs/live-state.md:149
    from pydantic import BaseModel, Field


    class Card(BaseModel):
        title: str
        votes: int = 0


    class Wall(BaseModel):
        cards: dict[str, Card] = Field(default_factory=dict)


    cards = {f"c{i}": Card(title=f"card {i}") for i in range(10_000)}
    wall_sink = CollectingSink()
    wall = LiveState(wall_sink, "wall", Wall(cards=cards))
    wall.set(Wall(cards={**cards, "c7": Card(title="card 7", votes=1)}))  # one entry replaced
    assert wall_sink.events[-1]["payload"]["patch"] == [
        {"op": "replace", "path": "/cards/c7/votes", "value": 1}
    ]
    # --- docs/live-state.md:185
    late = Client(board)
    board.set({"open": ["ship", "celebrate"], "done": 1})
    board.set({"open": ["celebrate"], "done": 2})

    late.on_event(sink.events[-1])  # it never saw the one before

    assert late.reseeds == 2
    assert late.state == {"open": ["celebrate"], "done": 2}
    assert late.rev == board.snapshot().rev
    # --- docs/live-state.md:201
    from streamkit.live_state import MAX_PATCH_BYTES

    big = LiveState(sink, "archive", {"blob": ""})
    watcher = Client(big)
    big.set({"blob": "x" * MAX_PATCH_BYTES})

    last = sink.events[-1]["payload"]
    assert last["patch"] is None
    assert last["to"] == big.snapshot().rev
    watcher.on_event(sink.events[-1])
    assert watcher.reseeds == 2
    assert len(watcher.state["blob"]) == MAX_PATCH_BYTES
    # --- docs/live-state.md:222
    first = LiveState(sink, "counter", {"n": 0})
    stale = Client(first)
    first.set({"n": 1})
    old_revs = {e["payload"]["to"] for e in sink.events if e["payload"]["key"] == "counter"}

    reborn = LiveState(sink, "counter", {"n": 1})  # e.g. after a restart
    stale.live = reborn
    reborn.set({"n": 2})
    assert sink.events[-1]["payload"]["from"] not in old_revs | {stale.rev}

    stale.on_event(sink.events[-1])
    assert stale.reseeds == 2
    assert stale.state == {"n": 2}
    # --- docs/live-state.md:247
    quiet_sink = CollectingSink()
    quiet = LiveState(quiet_sink, "quiet", {"n": 0})
    old_rev = quiet.snapshot().rev
    seed = quiet.rebase({"n": 5})
    assert quiet_sink.events == []
    assert seed.rev == old_rev + 1
    quiet.set({"n": 6})
    (delta,) = quiet_sink.events
    assert delta["payload"]["from"] == seed.rev
    assert apply_delta(seed.state, delta["payload"]["patch"]) == {"n": 6}
    # --- docs/live-state.md:268
    import asyncio


    class SlowSink:
        def __init__(self):
            self.events = []

        async def append(self, *events):
            await asyncio.sleep(0.001)
            self.events.extend(events)


    slow = SlowSink()
    queue = LiveState(slow, "queue", [])
    for n in range(1, 4):
        queue.set(list(range(n)))

    assert queue.pending == 3  # issued, not yet settled
    await queue.drain()
    assert queue.pending == 0
    start = queue.snapshot().rev - 3
    assert [e["payload"]["from"] for e in slow.events] == [start, start + 1, start + 2]
    # --- docs/live-state.md:304
    import datetime as dt

    from pydantic import BaseModel


    class Job(BaseModel):
        name: str
        due: dt.datetime | None = None


    jobs_sink = CollectingSink()
    jobs = LiveState(jobs_sink, "jobs", [Job(name="backup")])
    jobs.set([Job(name="backup", due=dt.datetime(2030, 1, 1, tzinfo=dt.UTC))])

    (change,) = jobs_sink.events
    assert change["payload"]["patch"] == [
        {"op": "replace", "path": "/0/due", "value": "2030-01-01T00:00:00Z"}
    ]
    # --- docs/live-state.md:331
    odd_sink = CollectingSink()
    odd = LiveState(odd_sink, "odd", {"tags": []})
    follower = Client(odd)

    odd.set({"tags": {"a", "b"}})  # a Python set: not JSON
    assert odd_sink.events == []
    assert odd.get() == {"tags": {"a", "b"}}
    assert odd.snapshot().rev == follower.rev + 1

    odd.set({"tags": ["a", "b"]})
    (delta,) = odd_sink.events
    assert delta["payload"]["from"] == follower.rev + 1
    assert apply_delta({"tags": []}, delta["payload"]["patch"]) == {"tags": ["a", "b"]}
    # --- docs/live-state.md:354
    from streamkit import apply_delta, diff_json

    queue = [f"task-{n:03}" for n in range(20)]
    board = {"queue": queue, "done": 2}
    moved = {"queue": [queue[-1], *queue[:-1]], "done": 3}  # the last task jumps the queue
    patch = diff_json(board, moved)
    assert patch == [
        {"op": "move", "from": "/queue/19", "path": "/queue/0"},
        {"op": "replace", "path": "/done", "value": 3},
    ]
    assert apply_delta(board, patch) == moved
    # A patch is never larger than replacing the value: a small value changed a lot.
    assert diff_json({"a": 1, "b": 2}, {"c": 3}) == [{"op": "replace", "path": "", "value": {"c": 3}}]


if __name__ == "__main__":
    asyncio.run(main())
