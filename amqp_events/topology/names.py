"""Names of services, events and their queues: what a topology is built from, checked once."""

from __future__ import annotations

import functools
import re

from amqp_events.errors import InvalidName
from amqp_events.topology import delays

#: The header that carries an event's key (:mod:`amqp_events.wire.message`), which the ordered exchange hashes.
EVENT_KEY_HEADER = "event_key"

_WORD = r"[A-Za-z0-9_-]+"
_SERVICE = re.compile(rf"^{_WORD}$")
_EVENT = re.compile(rf"^{_WORD}(\.{_WORD})*$")
_MAX_QUEUE_NAME = 255 - len(delays.routing_key(0, delays.queue_destination("")))


def check_service_name(service: object) -> str:
    if not isinstance(service, str) or not _SERVICE.match(service):
        raise InvalidName(
            f"service name {service!r} must be letters, digits, '_' or '-' (no dots or colons: "
            "they separate the parts of queue names)"
        )
    return service


def check_event_name(event: object) -> str:
    if not isinstance(event, str):
        raise InvalidName(f"event name {event!r} must be a string, like 'billing.invoice.paid'")
    return _checked_event_name(event)


@functools.lru_cache(maxsize=4096)  # firing checks the name every time: the names an app fires are few
def _checked_event_name(event: str) -> str:
    if not _EVENT.match(event):
        raise InvalidName(
            f"event name {event!r} must be dot-separated words of letters, digits, '_' or '-', "
            "like 'billing.invoice.paid'"
        )
    if event.startswith("celery."):
        raise InvalidName(f"event name {event!r} is reserved: names starting with 'celery.' are Celery's")
    return event


def event_queue_name(service: str, event: str) -> str:
    """The queue in which ``service`` receives ``event``."""
    name = f"{check_service_name(service)}:{check_event_name(event)}"
    if len(name) > _MAX_QUEUE_NAME:
        raise InvalidName(f"queue name {name!r} is longer than {_MAX_QUEUE_NAME} characters")
    return name


def archive_queue_name(service: str) -> str:
    return f"{check_service_name(service)}.archive"


def ordered_exchange_name(service: str) -> str:
    """The exchange that spreads the events of ``service``'s ordered handlers over its partitions by key."""
    return f"{check_service_name(service)}.ordered"


def is_ordered_exchange(name: str) -> bool:
    """Is ``name`` a service's ordered exchange (which workers declare, never producers)?"""
    service, dot, rest = name.partition(".")
    return bool(dot) and rest == "ordered" and bool(_SERVICE.match(service))


def partition_queue_name(service: str, partition: int) -> str:
    """Partition ``partition`` of ``service``'s ordered handlers."""
    return f"{ordered_exchange_name(service)}.{partition:02d}"
