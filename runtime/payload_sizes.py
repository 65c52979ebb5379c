"""The largest payloads in a run's history and its child workflows' histories: how close a run came to Temporal's limits."""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.message import Message
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

__all__ = ["PayloadSizes", "history_payloads", "run_payloads"]

# Each is measured whole and not looked into: Temporal's size limits apply to them one by one.
_MEASURED = ("temporal.api.common.v1.Payloads", "temporal.api.common.v1.Payload", "temporal.api.failure.v1.Failure",
             "temporal.api.common.v1.Memo")


@dataclass
class PayloadSizes:
    """The payload-bearing fields of some histories: how many, the largest (bytes, where), and the events."""

    fields: int = 0
    events: int = 0
    workflows: int = 0
    largest: tuple[int, str] = (0, "")
    failures: list[str] = field(default_factory=list)

    def over(self, limit: int) -> bool:
        return self.largest[0] > limit


def _walk(message: Message, where: str, sizes: PayloadSizes) -> None:
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        items = [value] if isinstance(value, Message) else list(value.values()) if hasattr(value, "values") else list(value)
        for item in items:
            if not isinstance(item, Message):  # a map of scalars
                continue
            if item.DESCRIPTOR.full_name in _MEASURED:
                sizes.fields += 1
                if item.ByteSize() > sizes.largest[0]:
                    sizes.largest = (item.ByteSize(), f"{where} {descriptor.name}")
            else:
                _walk(item, where, sizes)


def history_payloads(history: WorkflowHistory, workflow_id: str, sizes: PayloadSizes | None = None) -> PayloadSizes:
    """Every payload-bearing field of `history`, added to `sizes`; failed activities' messages kept in `failures`."""
    sizes = sizes or PayloadSizes()
    sizes.workflows += 1
    for event in history.events:
        sizes.events += 1
        _walk(event, f"{workflow_id} event {event.event_id} {EventType.Name(event.event_type)}", sizes)
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            sizes.failures.append(event.activity_task_failed_event_attributes.failure.message)
    return sizes


async def run_payloads(client: Client, workflow_id: str) -> PayloadSizes:
    """history_payloads over a run's history and, recursively, every child workflow it started."""
    sizes = PayloadSizes()
    pending = [workflow_id]
    while pending:
        current = pending.pop()
        history = await client.get_workflow_handle(current).fetch_history()
        history_payloads(history, current, sizes)
        pending += [e.start_child_workflow_execution_initiated_event_attributes.workflow_id for e in history.events
                    if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED]
    return sizes
