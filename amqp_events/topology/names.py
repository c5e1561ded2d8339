"""Names of services, events and their queues: what a topology is built from, checked once."""

from __future__ import annotations

import functools
import re
import zlib

from amqp_events.errors import InvalidName
from amqp_events.settings import KEY_SLOTS
from amqp_events.topology import delays

#: The header that carries an event's key (:mod:`amqp_events.wire.message`).
EVENT_KEY_HEADER = "event_key"
#: The header that carries its key's slot (:func:`slot_of`), on which the ordered exchanges route.
EVENT_SLOT_HEADER = "event_slot"
#: Keys fall into this many slots; a service's partitions share them out (so it has at most this many).
SLOTS = KEY_SLOTS

_WORD = r"[A-Za-z0-9_-]+"
_SERVICE = re.compile(rf"^{_WORD}$")
_EVENT = re.compile(rf"^{_WORD}(\.{_WORD})*$")
_RESERVED = ("amq", delays.PREFIX)
_MAX_QUEUE_NAME = 255 - len(delays.routing_key(0, delays.queue_destination("")))


def check_service_name(service: object) -> str:
    if not isinstance(service, str) or not _SERVICE.match(service):
        raise InvalidName(
            f"service name {service!r} must be letters, digits, '_' or '-' (no dots or colons: "
            "they separate the parts of queue names)"
        )
    if service in _RESERVED:
        # The shared topology's names and the broker's own start with these: a service so named would own them.
        raise InvalidName(f"service name {service!r} is reserved (the broker's 'amq.' names, the shared topology's)")
    return service


def direct_exchange_name(service: str) -> str:
    """The exchange through which a message reaches one queue of ``service`` by the queue's name (a retry, an
    archived copy, a replay): the service's own, so that no other service can write into its queues."""
    return f"{check_service_name(service)}.direct"


def dead_letter_exchange_name(service: str) -> str:
    """Where ``service``'s consumed queues dead-letter: a rejected message goes back to its queue, an expired
    one to the archive (back to its queue, it would be dropped as a dead-letter cycle)."""
    return f"{check_service_name(service)}.dead-letter"


def dead_lettering_service(exchange: str) -> str | None:
    """The service whose dead-letter exchange ``exchange`` is, if it is one's: a message routed by it was put
    where it is by the broker's dead-lettering, as its sender wrote it."""
    service, dot, rest = exchange.partition(".")
    return service if dot and rest == "dead-letter" and _SERVICE.match(service) else None


def is_direct_exchange(name: str) -> bool:
    """Is ``name`` a service's direct exchange (which workers declare, never producers)?"""
    service, dot, rest = name.partition(".")
    return bool(dot) and rest == "direct" and bool(_SERVICE.match(service))


def control_namespace(service: str) -> str:
    """Celery's ``control_exchange`` of ``service``'s workers: their remote control (``<service>.control.pidbox``,
    the queues ``<worker>.<service>.control.pidbox``) is the service's own, not the vhost's ``celery.pidbox``,
    so that no other service can revoke its events or stop its workers."""
    return f"{check_service_name(service)}.control"


def owner_of(queue: str) -> str | None:
    """The service whose queue ``queue`` is (``orders`` of ``orders:x.y``, ``orders.archive``...), if one's."""
    service = re.split(r"[.:]", queue, maxsplit=1)[0]
    if service == queue or not _SERVICE.match(service) or service in _RESERVED:
        return None
    return service


def task_of_queue(service: str, queue: str) -> str | None:
    """The handler task whose own queue (``per_handler``) ``queue`` is, if it is one: ``orders:x.y`` -> ``x.y``."""
    prefix = f"{service}:"
    return queue[len(prefix) :] if queue.startswith(prefix) else None


def to_queue(queue: str) -> tuple[str, str]:
    """``(exchange, routing key)`` that reach ``queue`` alone: its service's direct exchange, by its name (the
    default exchange for a queue no service owns)."""
    service = owner_of(queue)
    return (direct_exchange_name(service), queue) if service else ("", queue)


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


def check_handler_label(label: object) -> str:
    """A handler's own name (``@app.handler(event, name=...)``): one word, like a service's."""
    if not isinstance(label, str) or not _SERVICE.match(label):
        raise InvalidName(f"handler name {label!r} must be letters, digits, '_' or '-' (like 'welcome_email')")
    return label


def task_name(event: str, label: str | None = None) -> str:
    """The task (and ``task`` header) of a handler of ``event``: the event's name for its unnamed handler,
    ``<event>:<label>`` for one registered with its own name (a fired event names only its event)."""
    return check_event_name(event) if label is None else f"{check_event_name(event)}:{check_handler_label(label)}"


def event_of(task: str) -> str:
    """The event of a task name (:func:`task_name`)."""
    return task.partition(":")[0]


def event_queue_name(service: str, event: str) -> str:
    """The queue in which ``service`` receives ``event``; ``event`` may be a handler's task name
    (:func:`task_name`): ``orders:user.created:welcome_email`` is the named handler ``welcome_email``'s."""
    event, colon, label = event.partition(":")
    name = f"{check_service_name(service)}:{check_event_name(event)}"
    if colon:
        name = f"{name}:{check_handler_label(label)}"
    if len(name) > _MAX_QUEUE_NAME:
        raise InvalidName(f"queue name {name!r} is longer than {_MAX_QUEUE_NAME} characters")
    return name


def service_queue_name(service: str) -> str:
    """The one queue of all ``service``'s (unordered) handlers, with ``amqp_events_queue_layout = "per_service"``."""
    return f"{check_service_name(service)}.events"


def is_event_queue(name: str, service: str) -> bool:
    """Is ``name`` a queue from which ``service``'s handlers take fired events (in either layout)?"""
    return name.startswith(f"{service}:") or name == f"{service}.events"


def handler_queue_name(service: str, task: str, layout: str) -> str:
    """Where the handler ``task`` (:func:`task_name`) of ``service`` takes its events from, in ``layout``."""
    return service_queue_name(service) if layout == "per_service" else event_queue_name(service, task)


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


def is_partition_queue(name: str, service: str) -> bool:
    """Is ``name`` one of ``service``'s partitions (``<service>.ordered.NN``)?"""
    prefix = f"{ordered_exchange_name(service)}."
    return name.startswith(prefix) and name[len(prefix) :].isdigit()


def intake_queue_name(service: str) -> str:
    """Where ``service``'s ordered events that came without a slot wait to be given one (and sent on)."""
    return f"{ordered_exchange_name(service)}.intake"


def workers_queue_name(service: str) -> str:
    """A queue that ``service``'s workers consume only to be counted (its partitions' consumer counts show the
    active consumer alone)."""
    return f"{ordered_exchange_name(service)}.workers"


def slot_of(key: str) -> str:
    """The slot of an event key: the CRC-32 of its UTF-8 bytes, modulo :data:`SLOTS`, in decimal.

    The same in every language (zlib's CRC-32: Java's ``java.util.zip.CRC32``, Node's ``zlib.crc32``).
    """
    return str(zlib.crc32(key.encode("utf-8")) % SLOTS)


def parked_queue_name(service: str, partition: int) -> str:
    """Where the events parked behind an archived one of partition ``partition`` wait (ordered handlers)."""
    return parked_queue_of(partition_queue_name(service, partition))


def parked_queue_of(partition_queue: str) -> str:
    return f"{partition_queue}.parked"


def is_parked_queue(name: str, service: str) -> bool:
    return name.startswith(f"{ordered_exchange_name(service)}.") and name.endswith(".parked")


def queue_kind(name: str, service: str) -> str:
    """What queue ``name`` is to ``service``: ``main`` (an event queue), ``partition`` (of its ordered
    handlers), ``parked`` (a partition's parked events), ``delay`` (the shared ladder), ``archive`` or
    ``unroutable`` (the ladder's)."""
    if name == archive_queue_name(service):
        return "archive"
    if is_parked_queue(name, service):
        return "parked"
    if name.startswith(f"{ordered_exchange_name(service)}."):
        return "partition"
    if name == delays.UNROUTABLE:
        return "unroutable"
    if is_delay_queue(name):
        return "delay"
    return "main"


def is_delay_queue(name: str) -> bool:
    """Is ``name`` a queue of the delay ladder (shared by every service of the vhost)?"""
    return name.startswith(f"{delays.PREFIX}.delay.")


#: The stream that keeps every fired event of the vhost, when a service asks for history (``amqp_events_history``).
HISTORY_STREAM = f"{delays.PREFIX}.history"


def history_cursor_queue_name(service: str) -> str:
    """Where ``history replay`` keeps how far a replay into ``service`` got (the last word only)."""
    return f"{check_service_name(service)}.history.cursor"


def fired_event(exchange: str, routing_key: str, events_exchange: str) -> str | None:
    """The event a message was routed as, when it was routed by its event (the events exchange, or the delay
    ladder's ``event.`` destinations): what a topic permission let its sender publish."""
    if exchange == events_exchange:
        return routing_key
    if exchange == delays.DELIVERY_EXCHANGE or exchange.startswith(f"{delays.PREFIX}.delay."):
        try:
            kind, _, name = delays.decode_routing_key(routing_key)[1].partition(".")
        except ValueError:
            return None
        return name if kind == "event" else None
    return None
