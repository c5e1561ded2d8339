"""Bad input for the fault suite: messages no handler can run, each with the reason it must be archived for.

Every probe goes to the events exchange with routing key ``fault.a``, so every
service receives it; each carries a ``fault_probe`` header naming it.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from amqp.exceptions import PreconditionFailed
from kombu import Connection

from amqp_events import Reason

#: The fault broker refuses messages above this size (rabbitmq.conf ``max_message_size``).
MAX_MESSAGE_SIZE = 4 * 1024 * 1024


@dataclass(frozen=True)
class Probe:
    name: str
    #: The archive reason every service must give it; None: the broker refuses it at publish time.
    reason: str | None
    body: bytes
    headers: dict[str, Any]
    content_type: str = "application/json"


def _valid_headers(name: str, task: Any = "fault.a") -> dict[str, Any]:
    return {"task": task, "id": f"probe-{name}", "retries": 0, "fault_probe": name}


PROBES = [
    Probe("garbage", Reason.UNDECODABLE, b"\x00{this is not json", _valid_headers("garbage")),
    Probe("pickle", Reason.FORBIDDEN_CONTENT_TYPE, pickle.dumps(([1], {}, {})), _valid_headers("pickle"),
          "application/x-python-serialize"),
    Probe("no-task-header", Reason.UNDECODABLE, b"[[], {}, {}]", {"id": "probe-nt", "fault_probe": "no-task-header"}),
    Probe("unknown-event", Reason.UNKNOWN_EVENT, b"[[], {}, {}]", _valid_headers("unknown-event", "fault.unknown")),
    Probe("non-utf8-task", Reason.UNKNOWN_EVENT, b"[[], {}, {}]", _valid_headers("non-utf8-task", b"fault.\xff\xfe")),
    Probe("wrong-arguments", Reason.BAD_ARGUMENTS, b'[["x", "y"], {"nope": 1}, {}]', _valid_headers("wrong-arguments")),
    Probe("deeply-nested", Reason.UNDECODABLE, b"[" * 200_000 + b"]" * 200_000, _valid_headers("deeply-nested")),
    Probe("multi-frame", Reason.BAD_ARGUMENTS,
          json.dumps([["x" * (1024 * 1024)], {"nope": 1}, {}]).encode(), _valid_headers("multi-frame")),
    Probe("over-size-limit", None, b" " * (MAX_MESSAGE_SIZE + 1024), _valid_headers("over-size-limit")),
]  # fmt: skip


def publish(url: str, probe: Probe, on_refused: Callable[[Probe, Exception], None]) -> None:
    """Publish ``probe`` raw (with a confirm); ``on_refused`` when the broker refuses it."""
    with Connection(url, transport_options={"confirm_publish": True}) as connection:
        try:
            connection.Producer().publish(
                probe.body,
                exchange="events",
                routing_key="fault.a",
                headers=probe.headers,
                content_type=probe.content_type,
                content_encoding="utf-8" if probe.content_type == "application/json" else "binary",
                serializer=None,
                delivery_mode=2,
            )
        except PreconditionFailed as exc:
            on_refused(probe, exc)
