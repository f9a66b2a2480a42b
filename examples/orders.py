"""An example processor for ``streamkit host``: counts orders and acknowledges each one.

Run it::

    PYTHONPATH=examples streamkit host --db demo.db --processor orders:OrderBook

then, from another shell, ``streamkit append --db demo.db order.placed --payload
'{"order": 1, "amount": 9.5}'`` and ``streamkit snapshot --db demo.db orders``.

The reduce is pure (it folds ``order.placed`` and ``order.acknowledged`` into
counts); the effect appends one ``order.acknowledged`` per placed order, with
an idempotency key, so a batch retried after a crash does not acknowledge twice.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from streamkit import EventDefinition, StreamEvent, StreamProcessor, define_processor_contract
from streamkit.processor import ProcessEventArgs


class OrderPlaced(BaseModel):
    order: int
    amount: float = 0.0


class OrderAcknowledged(BaseModel):
    order: int


class Book(BaseModel):
    placed: int = 0
    acknowledged: int = 0
    total: float = 0.0
    open: list[int] = Field(default_factory=list)


class OrderBook(StreamProcessor[Book]):
    contract = define_processor_contract(
        slug="orders",
        version="1",
        description="counts placed orders and acknowledges each one",
        state_schema=Book,
        events={
            "order.placed": EventDefinition(
                description="a customer placed an order", payload_schema=OrderPlaced
            ),
            "order.acknowledged": EventDefinition(
                description="the order book saw the order", payload_schema=OrderAcknowledged
            ),
        },
        consumes=["order.placed", "order.acknowledged"],
        emits=["order.acknowledged"],
    )

    def reduce(self, event: StreamEvent, state: Book) -> Book | None:
        payload = event.payload
        if isinstance(payload, OrderPlaced):
            return state.model_copy(
                update={
                    "placed": state.placed + 1,
                    "total": state.total + payload.amount,
                    "open": [*state.open, payload.order],
                }
            )
        if isinstance(payload, OrderAcknowledged):
            return state.model_copy(
                update={
                    "acknowledged": state.acknowledged + 1,
                    "open": [o for o in state.open if o != payload.order],
                }
            )
        return None

    def process_event(self, args: ProcessEventArgs[Book]) -> None:
        event = args.event
        if event is None or not isinstance(event.payload, OrderPlaced):
            return
        order = event.payload.order
        ack = {
            "type": "order.acknowledged",
            "payload": {"order": order},
            "idempotency_key": self.idempotency_key(f"ack-{order}"),
        }
        args.block_processor_while(lambda: args.append(ack))
