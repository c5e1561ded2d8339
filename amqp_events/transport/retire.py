"""Retiring a service: deleting what is its own on the broker, so that its queues stop collecting events.

Only the service's own queues and exchanges go (``topology.is_own``); what
the vhost's services share stays. While a consumer reads one of its queues
(a worker of the service runs), or one holds messages (events not handled
yet, the archive) and they are not to be discarded, nothing is deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from amqp.exceptions import NotFound
from kombu import Connection

from amqp_events.topology.layout import Topology


@dataclass
class Retired:
    """What a retirement deleted, or the queues that kept it from deleting anything, with the reason."""

    deleted: list[str] = field(default_factory=list)
    #: Name -> why it stays (in use, not empty).
    kept: dict[str, str] = field(default_factory=dict)


def own_parts(topology: Topology) -> tuple[list[str], list[str]]:
    """The names of the service's own queues and exchanges, in the order they are deleted."""
    queues = [queue.name for queue in topology.queues if topology.is_own(queue.name)]
    exchanges = [exchange.name for exchange in topology.exchanges if topology.is_own(exchange.name)]
    return queues, exchanges


def retire_topology(connection: Connection, topology: Topology, discard: bool = False) -> Retired:
    """Delete the service's own queues and exchanges, unless a queue is read by a consumer or holds messages
    (without ``discard``): then nothing is deleted. (Quorum queues refuse the broker's own ``if-unused`` and
    ``if-empty`` checks: they are made first, from each queue's counts.)"""
    queues, exchanges = own_parts(topology)
    retired = Retired()
    channel: Any = connection.channel()
    try:
        found = []
        for name in queues:
            try:
                _, messages, consumers = channel.queue_declare(name, passive=True)
            except NotFound:  # gone already (or never declared): nothing collects events there
                channel = connection.channel()
                continue
            found.append(name)
            if consumers:
                retired.kept[name] = f"{consumers} consumer(s) read it"
            elif messages and not discard:
                retired.kept[name] = f"it holds {messages} message(s)"
        if retired.kept:
            return retired
        for name in found:
            channel.queue_delete(name)
            retired.deleted.append(name)
        for name in exchanges:
            channel.exchange_delete(name)
            retired.deleted.append(name)
    finally:
        if channel.is_open:
            channel.close()
    return retired


def delete_if_idle(connection: Connection, queue: str) -> str | None:
    """Delete ``queue`` if nothing reads it and it holds nothing; otherwise (or if it is gone) say why not."""
    channel: Any = connection.channel()
    try:
        _, messages, consumers = channel.queue_declare(queue, passive=True)
        if consumers:
            return f"{consumers} consumer(s) read it"
        if messages:
            return f"it holds {messages} message(s)"
        channel.queue_delete(queue)
        return None
    except NotFound:
        return "it is gone"
    finally:
        if channel.is_open:
            channel.close()
