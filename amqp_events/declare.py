"""Declaring a :class:`~amqp_events.topology.Topology` on a live broker."""

from __future__ import annotations

import re
from typing import Any

from amqp.exceptions import PreconditionFailed
from kombu import Connection

from amqp_events.topology import Topology

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']+)'"
    r" in vhost '(?P<vhost>[^']*)': received (?P<received>.+?) but current is (?P<current>.+)$"
)
_VALUE = re.compile(r"^(?:the value )?'(?P<value>.*?)'(?: of type '[^']*')?$")


class TopologyMismatch(RuntimeError):
    """An exchange or queue exists on the broker with other arguments than this service declares."""

    def __init__(self, text: str, kind: str = "", name: str = "", argument: str = "") -> None:
        super().__init__(text)
        self.kind, self.name, self.argument = kind, name, argument

    @classmethod
    def from_error(cls, error: PreconditionFailed) -> TopologyMismatch:
        reply = str(getattr(error, "reply_text", "") or error)
        found = _INEQUIVALENT.search(reply)
        if not found:
            return cls(f"the broker refused this service's topology: {reply}")
        kind, name, vhost, argument = found["kind"], found["name"], found["vhost"], found["argument"]
        current, wanted = _readable(found["current"]), _readable(found["received"])
        removal = (
            f"`rabbitmqctl delete_queue {name!r} -p {vhost!r}`"
            if kind == "queue"
            else "the management UI or `rabbitmqadmin delete exchange`"
        )
        return cls(
            f"{kind} {name!r} in vhost {vhost!r} already exists with {argument}={current}, but this service "
            f"declares {argument}={wanted}. RabbitMQ never changes an existing {kind}'s arguments. Fix: move "
            f"its messages elsewhere and delete it ({removal}), then start the worker again; or change the "
            f"app's settings so that they match. `amqp-events -A <app> topology check` lists every "
            "difference.",
            kind=kind,
            name=name,
            argument=argument,
        )


def _readable(value: str) -> str:
    value = value.strip()
    if value == "none":
        return "(not set)"
    found = _VALUE.match(value)
    return repr(found["value"]) if found else value


def declare_topology(connection: Connection, topology: Topology) -> None:
    """Declare every exchange, queue and binding of ``topology`` (idempotent).

    Raises :class:`TopologyMismatch` when something exists with other arguments.
    """
    channel: Any = connection.channel()
    try:
        for exchange in topology.exchanges:
            exchange.declare(channel=channel)
        for queue in topology.queues:
            queue.declare(channel=channel)
        for link in topology.bindings:
            link.destination.bind_to(link.source, routing_key=link.routing_key, channel=channel)
    except PreconditionFailed as error:
        raise TopologyMismatch.from_error(error) from None
    finally:
        if channel.is_open:
            channel.close()
