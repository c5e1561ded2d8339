"""The RabbitMQ permissions a service's user needs, and no more (``amqp-events topology permissions``).

A service owns every exchange and queue whose name starts with its name and a dot or a colon (its event
queues, archive, direct and ordered exchanges, partitions, history cursor) and its workers' remote control
(``<worker>.<service>.control.pidbox``). On those it may configure, write and read. Of what the vhost's
services share, it writes to the events exchange (firing), the delay ladder's entry (delays and retries) and the
heartbeats exchange; it reads (binds from) the
events, delivery and heartbeats exchanges, and the history stream when it keeps history. It never configures
them: an administrator declares them, and the service only checks them (``amqp_events_shared_topology =
"check"``). Topic permissions keep its delayed copies and its queues' delivery bindings to its own queues
(and to events, which anyone may fire); with event ownership on (``amqp_events_event_ownership``), they keep
what it fires, on the events exchange and through the ladder, to the events it owns
(:mod:`amqp_events.topology.ownership`).

Without write on the default exchange (``amq.default``), without read on the ladder's queues and without
configure on anything shared, a service cannot put a message into another's queue or archive (other than by
firing an event it handles), take or purge another's pending retries, delete what others share, or revoke
another's events or stop its workers.

Pure: nothing here talks to a broker.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from amqp_events.settings import Settings
from amqp_events.topology import delays
from amqp_events.topology.layout import HEARTBEATS
from amqp_events.topology.names import HISTORY_STREAM, check_service_name, control_namespace
from amqp_events.topology.ownership import owned_regex


@dataclass(frozen=True)
class Grants:
    """One user's permissions on a vhost: a regular expression of resource names per kind of access, and
    topic permissions (routing keys it may publish with and bind with) per exchange."""

    configure: str
    write: str
    read: str
    #: ``(exchange, write pattern, read pattern)``.
    topics: tuple[tuple[str, str, str], ...]


def _one_of(*patterns: str) -> str:
    return "^(" + "|".join(patterns) + ")$"


def service_grants(service: str, settings: Settings) -> Grants:
    """What the user of ``service`` needs on its vhost, with the shared topology declared by an administrator."""
    name = re.escape(check_service_name(service))
    own = (rf"{name}[.:].*", rf".+\.{re.escape(control_namespace(service))}\.pidbox")
    events, delivery, entry = (
        re.escape(n) for n in (settings.exchange, delays.DELIVERY_EXCHANGE, delays.ENTRY_EXCHANGE)
    )
    heartbeats = re.escape(HEARTBEATS)
    history = (re.escape(HISTORY_STREAM),) if settings.history else ()
    bits = rf"([01]\.){{{delays.LEVELS}}}"
    stars = rf"(\*\.){{{delays.LEVELS}}}"
    destinations = rf"(queue\.{name}[.:]|event\.).+"
    topics = [
        (delays.ENTRY_EXCHANGE, f"^{bits}{destinations}$", "^$"),
        (delays.DELIVERY_EXCHANGE, "^$", f"^{stars}{destinations}$"),
    ]
    if settings.event_ownership:  # it fires its own events alone, now or after a delay; it may bind any event
        owned = owned_regex(service, settings.event_owners)
        topics[0] = (delays.ENTRY_EXCHANGE, rf"^{bits}(queue\.{name}[.:].+|event\.({owned}))$", "^$")
        topics.append((settings.exchange, f"^({owned})$", ".*"))
    return Grants(
        configure=_one_of(*own),
        write=_one_of(*own, events, entry, heartbeats),
        read=_one_of(*own, events, delivery, heartbeats, *history),
        topics=tuple(topics),
    )


def rabbitmqctl_commands(grants: Grants, user: str, vhost: str) -> list[str]:
    """``grants`` as ``rabbitmqctl`` commands, one a line, ready to run."""
    quote, where = shlex.quote, f"-p {shlex.quote(vhost)} {shlex.quote(user)}"
    lines = [
        f"rabbitmqctl set_permissions {where} {quote(grants.configure)} {quote(grants.write)} {quote(grants.read)}"
    ]
    lines.extend(
        f"rabbitmqctl set_topic_permissions {where} {quote(exchange)} {quote(write)} {quote(read)}"
        for exchange, write, read in grants.topics
    )
    return lines
