"""Declaring a :class:`~amqp_events.topology.Topology` on a live broker."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from typing import Any

from amqp.exceptions import AccessRefused, NotFound, PreconditionFailed
from kombu import Connection, Queue

from amqp_events.errors import PermissionRefused, TopologyMismatch, TopologyMissing
from amqp_events.topology.layout import (
    DELIVERY_LIMIT,
    KEPT_AS_THEY_ARE,
    Binding,
    Topology,
    earlier_dead_lettering,
    no_delivery_limit_policy,
)

logger = logging.getLogger(__name__)

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']+)'"
    r" in vhost '(?P<vhost>[^']*)': received (?P<received>.+?) but current is (?P<current>.+)$"
)
_VALUE = re.compile(r"^(?:the value )?'(?P<value>.*?)'(?: of type '[^']*')?$")

# RabbitMQ 3.x looks a queue up in two tables without a transaction: a declaration racing another connection's
# creation of the same durable queue may be told its "home node ... is down or inaccessible" (processes of one
# service starting together). Asked again, the queue is there; a home node really down is still reported.
_CREATION_RACE = "is down or inaccessible"
_CREATION_RACE_TRIES = 50
_CREATION_RACE_PAUSE = 0.1


def mismatch(error: PreconditionFailed) -> TopologyMismatch:
    """The broker's refusal of a declaration, as an error that names the entity, the argument and the fix."""
    reply = str(getattr(error, "reply_text", "") or error)
    found = _INEQUIVALENT.search(reply)
    if not found:
        return TopologyMismatch(f"the broker refused this service's topology: {reply}")
    kind, name, vhost, argument = found["kind"], found["name"], found["vhost"], found["argument"]
    current, wanted = _readable(found["current"]), _readable(found["received"])
    removal = (
        f"`rabbitmqctl delete_queue {name!r} -p {vhost!r}`"
        if kind == "queue"
        else "the management UI or `rabbitmqadmin delete exchange`"
    )
    return TopologyMismatch(
        f"{kind} {name!r} in vhost {vhost!r} already exists with {argument}={current}, but this service "
        f"declares {argument}={wanted}. RabbitMQ never changes an existing {kind}'s arguments. Fix: move "
        f"its messages elsewhere and delete it ({removal}), then start the worker again; or change the "
        f"app's settings so that they match. `amqp-events -A <app> topology check` lists every "
        "difference.",
        kind=kind,
        name=name,
        argument=argument,
    )


def missing(error: NotFound, topology: Topology) -> TopologyMissing:
    """A shared exchange or queue that is not there, although this service only checks it; or a queue whose
    node is down."""
    reply = str(getattr(error, "reply_text", "") or error)
    if _CREATION_RACE in reply:
        return TopologyMissing(f"{reply}: service {topology.service!r} starts once the node holding it runs again")
    return TopologyMissing(
        f"{reply}: service {topology.service!r} only checks the topology every service shares "
        "(amqp_events_shared_topology = 'check'); an administrator declares it with "
        "`amqp-events -A <app> topology declare` as a user that may configure it"
    )


def refused(error: AccessRefused, topology: Topology) -> PermissionRefused:
    """The broker refused a declaration to this service's user: the message names the grant it lacks."""
    reply = str(getattr(error, "reply_text", "") or error)
    return PermissionRefused(
        f"{reply}. `amqp-events -A <app> topology permissions` prints what service {topology.service!r} needs"
        + (
            "; or let an administrator declare the shared topology and set amqp_events_shared_topology = 'check'"
            if not topology.checks_shared
            else ""
        )
    )


def _readable(value: str) -> str:
    value = value.strip()
    if value == "none":
        return "(not set)"
    found = _VALUE.match(value)
    return repr(found["value"]) if found else value


def declare_topology(connection: Connection, topology: Topology) -> list[str]:
    """Declare every exchange, queue and binding of ``topology`` (idempotent).

    Raises :class:`TopologyMismatch` when something exists with other
    arguments; except that a queue created (by an earlier version, or by
    hand) without the arguments that only place its replicas, or with another
    delivery limit or none, is kept as it is: returns the names of such queues
    (``topology check`` notes them).
    """
    kept: dict[str, list[str]] = {}
    channel: Any = connection.channel()

    def only_checked(name: str) -> bool:
        return topology.checks_shared and not topology.is_own(name)

    try:
        for exchange in topology.exchanges:
            exchange.declare(channel=channel)  # passive, when only checked (layout.shared_exchange)
        for queue in topology.queues:
            channel = _declare_queue(connection, channel, queue, kept, passive=only_checked(queue.name))
        for link in topology.bindings:
            destination: Any = link.destination  # a Queue or an Exchange: both bind the same way
            if not only_checked(destination.name):
                destination.bind_to(
                    link.source, routing_key=link.routing_key, arguments=link.arguments, channel=channel
                )
    except PreconditionFailed as error:
        raise mismatch(error) from None
    except NotFound as error:
        raise missing(error, topology) from None
    except AccessRefused as error:
        raise refused(error, topology) from None
    finally:
        if channel.is_open:
            channel.close()
    if kept:
        logger.warning(
            "%d queue(s) exist with other arguments than this version declares (created by an earlier version, "
            "or by hand) and were kept as they are; `amqp-events topology check` shows them: %s",
            len(kept),
            ", ".join(f"{name} ({', '.join(arguments)})" for name, arguments in kept.items()),
        )
    for name, arguments in kept.items():
        if DELIVERY_LIMIT in arguments:
            logger.warning(
                "queue %s has a delivery limit of its own or none: RabbitMQ 4.0 and later drop a message given out "
                "more often than that (20 by default) without an outcome; reading an archive counts too. Lift the "
                "limit with a policy (it replaces other policies of that queue): %s",
                name,
                no_delivery_limit_policy(name, connection.virtual_host),
            )
    return list(kept)


def _declare_queue(
    connection: Connection, channel: Any, queue: Queue, kept: dict[str, list[str]], passive: bool = False
) -> Any:
    """Declare ``queue`` (or only check it, ``passive``); on a mismatch of an argument it may be kept without,
    declare it without that one.

    Returns the channel to go on with (a refused declaration closes its channel).
    """
    arguments = dict(getattr(queue, "queue_arguments", None) or {})
    tries = 0
    while True:
        try:
            if passive:
                channel.queue_declare(queue.name, passive=True)
            else:
                _like(queue, arguments).declare(channel=channel)
            return channel
        except NotFound as error:
            tries += 1
            if _CREATION_RACE not in str(error) or tries == _CREATION_RACE_TRIES:
                raise
            time.sleep(_CREATION_RACE_PAUSE)
            channel = connection.channel()
        except PreconditionFailed as error:
            found = mismatch(error)
            earlier = earlier_dead_lettering(queue.name)
            if found.argument in earlier and arguments.get(found.argument) != earlier[found.argument]:
                arguments.update(earlier)  # a queue of 0.2: it dead-letters as it did
            elif found.kind != "queue" or found.argument not in KEPT_AS_THEY_ARE or found.argument not in arguments:
                raise found from None
            else:
                del arguments[found.argument]
            kept.setdefault(queue.name, []).append(found.argument)
            channel = connection.channel()


def _like(queue: Queue, arguments: dict[str, Any]) -> Queue:
    if arguments == (getattr(queue, "queue_arguments", None) or {}):
        return queue
    return Queue(
        queue.name,
        exchange=queue.exchange,
        routing_key=queue.routing_key,
        durable=queue.durable,
        auto_delete=queue.auto_delete,
        queue_arguments=arguments,
    )


def rebind(connection: Connection, bind: Iterable[Binding], unbind: Iterable[Binding]) -> None:
    """Add the bindings ``bind``, then remove ``unbind`` (in that order: what they route is never routed
    nowhere meanwhile); removing one that is not there does nothing."""
    channel: Any = connection.channel()
    try:
        for link in bind:
            channel.queue_bind(link.destination.name, link.source.name, link.routing_key, arguments=link.arguments)
        for link in unbind:
            channel.queue_unbind(link.destination.name, link.source.name, link.routing_key, arguments=link.arguments)
    finally:
        channel.close()
