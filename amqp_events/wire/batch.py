"""Replay batches: many events for one handler in one message, what a history replay sends. Pure: no I/O.

A catch-up sends thousands of events to one handler queue. One message per
event makes the replay and the worker frame, route, confirm and ack each of
them; a batch carries up to :data:`MAX_EVENTS` of them, and a worker runs
them one after another through the handling pipeline, each its own attempt
(a failed one is retried alone, as if it had come by itself), then acks the
batch once.

On the wire a batch is a JSON message whose ``task`` header is the handler's
event and whose ``replay_batch`` header counts its events; its body is a
list of ``{"headers": {...}, "body": [args, kwargs, embed]}``, each event's
headers and task body as the history kept them. Only events in the
library's own JSON form go into a batch; any other one is sent alone.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from amqp_events.topology.names import to_queue
from amqp_events.wire.message import JSON, OutgoingMessage, event_id, is_task_body

#: On a batch: how many events it carries.
REPLAY_BATCH = "replay_batch"
#: Events in one batch at most, and its body's size at most (bytes).
MAX_EVENTS = 100
MAX_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class BatchedEvent:
    """One event of a batch, as its handler gets it."""

    headers: dict[str, Any]
    args: list[Any]
    kwargs: dict[str, Any]

    @property
    def id(self) -> str:
        return event_id(self.headers)


def is_batch(headers: Mapping[str, Any] | None) -> bool:
    return bool(headers) and REPLAY_BATCH in headers  # type: ignore[operator]


def entry(headers: Mapping[str, Any], body: bytes) -> bytes | None:
    """An event's place in a batch (its headers and its JSON task body, kept as the bytes they are), or
    ``None`` when it must be sent alone: its body is not a task body, its headers are not plain JSON."""
    try:
        decoded = json.loads(body)
        encoded_headers = json.dumps(dict(headers), separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    if not is_task_body(decoded):
        return None
    return b'{"headers":' + encoded_headers.encode("utf-8") + b',"body":' + body + b"}"


def batch_message(queue: str, event: str, entries: list[bytes], extra_headers: Mapping[str, Any]) -> OutgoingMessage:
    """A batch of ``entries`` (made by :func:`entry`) of ``event``, for the handler queue ``queue``."""
    batch_id = uuid.uuid4().hex
    headers = {"task": event, "id": batch_id, REPLAY_BATCH: len(entries), **extra_headers}
    body = b"[" + b",".join(entries) + b"]"
    return OutgoingMessage(*to_queue(queue), headers, body, batch_id, JSON, "utf-8")


def events_of(event: object, decoded: Any) -> list[BatchedEvent]:
    """The events of a batch of ``event`` whose body decoded to ``decoded``; ``ValueError`` says what is wrong
    with it (the whole batch is then archived as it arrived: nothing of it ran)."""
    if not isinstance(decoded, list) or not decoded:
        raise ValueError("a replay batch's body is not a list of events")
    found = []
    for index, item in enumerate(decoded):
        headers = item.get("headers") if isinstance(item, dict) else None
        body: Any = item.get("body") if isinstance(item, dict) else None
        if not isinstance(headers, dict) or not is_task_body(body):
            raise ValueError(f"event {index} of a replay batch is not {{'headers': ..., 'body': [args, kwargs, _]}}")
        if headers.get("task") != event:
            raise ValueError(f"event {index} of a replay batch of {event!r} is a {headers.get('task')!r}")
        found.append(BatchedEvent(headers, list(body[0]), dict(body[1])))
    return found
