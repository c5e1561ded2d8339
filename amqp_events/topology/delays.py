"""The delay ladder: waiting on the broker, routed back to one destination.

A delayed message (a retry, or an event fired with a countdown) waits in a
ladder of quorum queues whose message TTLs are 1, 2, 4, ... 2**21 seconds.
Its routing key spells the delay in binary, most significant bit first,
followed by where it must go once the wait is over::

    0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.1.queue.orders:billing.invoice.paid
    '------------------ 22 bits: 5 s ---------' '--- destination -----------'

Level ``n`` has a topic exchange and a queue of the same name. The exchange
sends the message into the level's queue when bit ``n`` is 1 and straight on
to the next level's exchange when it is 0; the queue dead-letters expired
messages to the next level's exchange. After level 0 comes the delivery
exchange, which matches the destination part only: ``queue.<name>`` reaches
that one queue (a retry never fans out to other services), ``event.<name>``
reaches every queue subscribed to the event (a delayed fire).

So any whole number of seconds up to ``MAX_DELAY`` (about 48.5 days) costs
exactly ``LEVELS`` queues, whatever the number of services, events or
retries, and a message waits exactly its delay: never in worker memory.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone

from amqp_events.errors import DelayTooLong

LEVELS = 22
MAX_DELAY = 2**LEVELS - 1  # seconds: 4,194,303 s, a little over 48 days
PREFIX = "amqp_events"
DELIVERY_EXCHANGE = f"{PREFIX}.delivery"
UNROUTABLE = f"{PREFIX}.unroutable"


def level_name(level: int) -> str:
    """Name of both the exchange and the queue of ladder level ``level``."""
    return f"{PREFIX}.delay.{level:02d}"


#: Every delayed message is published to the highest level.
ENTRY_EXCHANGE = level_name(LEVELS - 1)

# A service's own ladder (``amqp_events_delay_ladder = "per_service"``): the same levels, named after the service
# (so that only its user may write to them), and its own exchange after level 0, bound to its queues alone.
_OWN_LEVEL = re.compile(r"^[A-Za-z0-9_-]+\.delay\.\d\d$")
_OWN_DELIVERY = re.compile(r"^[A-Za-z0-9_-]+\.delayed$")


def own_level_name(service: str, level: int) -> str:
    """Name of both the exchange and the queue of level ``level`` of ``service``'s own ladder."""
    return f"{service}.delay.{level:02d}"


def own_entry(service: str) -> str:
    """Where ``service`` publishes what waits in its own ladder."""
    return own_level_name(service, LEVELS - 1)


def own_delivery(service: str) -> str:
    """The exchange after level 0 of ``service``'s own ladder: each of its queues by ``queue.<name>``."""
    return f"{service}.delayed"


def is_ladder_level(name: str) -> bool:
    """Is ``name`` a level of a delay ladder, the shared one or a service's own (its exchange and its queue)?"""
    return name.startswith(f"{PREFIX}.delay.") or bool(_OWN_LEVEL.match(name))


def is_delivery_exchange(name: str) -> bool:
    """Is ``name`` where a ladder's waits end (the shared delivery exchange, or a service's own)?"""
    return name == DELIVERY_EXCHANGE or bool(_OWN_DELIVERY.match(name))


def level_ttl_ms(level: int) -> int:
    return 1000 << level


def bit_pattern(level: int, bit: str) -> str:
    """Topic pattern matching routing keys whose bit for ``level`` is ``bit``."""
    return "*." * (LEVELS - 1 - level) + bit + ".#"


def destination_pattern(destination: str) -> str:
    """Delivery-exchange pattern for one destination, skipping exactly the 22 bit words.

    Counting the bits (rather than ``#.``) matters because destinations
    contain dots: ``#.queue.a.b`` would also match ``queue.x.queue.a.b``.
    """
    return "*." * LEVELS + destination


def queue_destination(queue: str) -> str:
    return f"queue.{queue}"


def event_destination(event: str) -> str:
    return f"event.{event}"


def whole_seconds(delay: float) -> int:
    """A delay rounded up to whole seconds: a message may be late, never early."""
    if delay < 0 or math.isnan(delay):
        raise ValueError(f"a delay must be zero or more seconds, not {delay!r}")
    seconds = math.ceil(delay)
    if seconds > MAX_DELAY:
        raise DelayTooLong(
            f"a delay of {delay:g} s is longer than the longest the broker ladder holds "
            f"({MAX_DELAY} s, about {MAX_DELAY // 86400} days)"
        )
    return seconds


def seconds_until(eta: datetime, now: datetime) -> float:
    """Seconds from ``now`` to ``eta`` (naive datetimes are taken as UTC)."""
    if eta.tzinfo is None:
        eta = eta.replace(tzinfo=timezone.utc)
    return max(0.0, (eta - now).total_seconds())


def routing_key(delay: float, destination: str) -> str:
    """The ladder routing key that waits ``delay`` seconds, then reaches ``destination``."""
    bits = format(whole_seconds(delay), f"0{LEVELS}b")
    return ".".join(bits) + "." + destination


def decode_routing_key(key: str) -> tuple[int, str]:
    """Inverse of :func:`routing_key`: ``(delay seconds, destination)``."""
    words = key.split(".")
    bits, destination = words[:LEVELS], ".".join(words[LEVELS:])
    if len(bits) != LEVELS or any(bit not in ("0", "1") for bit in bits) or not destination:
        raise ValueError(f"not a delay routing key: {key!r}")
    return int("".join(bits), 2), destination
