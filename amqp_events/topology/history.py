"""The vhost's event history (``amqp_events_history``): a stream of every fired event, and a replay's cursor."""

from __future__ import annotations

from kombu import Exchange, Queue

from amqp_events.settings import Settings
from amqp_events.topology import delays
from amqp_events.topology.layout import Binding, delivery_exchange, events_exchange, quorum
from amqp_events.topology.names import HISTORY_STREAM, history_cursor_queue_name


def history_stream(settings: Settings) -> tuple[Queue, list[Binding]]:
    """The vhost's history: a stream of every event fired to the events exchange, and of every delayed fire once
    it is due (from the delivery exchange), kept by age and size (``amqp_events_history_*``)."""
    retention: dict[str, object] = {
        "x-queue-type": "stream",
        "x-max-age": settings.history_max_age,
        "x-stream-max-segment-size-bytes": settings.history_segment_bytes,
    }
    if settings.history_max_bytes:
        retention["x-max-length-bytes"] = settings.history_max_bytes
    stream = Queue(
        HISTORY_STREAM,
        exchange=events_exchange(settings),
        routing_key="#",
        durable=True,
        auto_delete=False,
        queue_arguments=retention,
    )
    delayed_fires = delays.destination_pattern(delays.event_destination("#"))
    return stream, [Binding(delivery_exchange(settings), stream, delayed_fires)]


def history_cursor_queue(service: str, settings: Settings) -> Queue:
    """The last word of ``history replay`` into ``service``: a queue holding one message, the newest."""
    name = history_cursor_queue_name(service)
    return Queue(
        name,
        exchange=Exchange(""),
        routing_key=name,
        durable=True,
        auto_delete=False,
        queue_arguments={**quorum(settings), "x-max-length": 1},
    )


_UNIT_SECONDS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}


def max_age_seconds(max_age: str) -> float:
    """A stream's ``x-max-age`` (``7D``, ``12h``) in seconds (a year as 365 days, a month as 30)."""
    return float(int(max_age[:-1]) * _UNIT_SECONDS[max_age[-1]])
