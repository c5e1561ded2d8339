"""Listening to the workers' heartbeats (``amqp_events.heartbeats``): who is online, and their breakers' and
health checks' states, as the CLI's ``breakers`` command and the console show them. A beat that is malformed,
or comes from a user that does not stand for the service it names, is dropped with a log line
(:mod:`amqp_events.wire.heartbeats`)."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from amqp_events.topology.layout import heartbeats_listener
from amqp_events.wire.heartbeats import read_heartbeat
from amqp_events.wire.trust import Identity

logger = logging.getLogger(__name__)

#: A worker's latest heartbeat, by ``(service, worker)``.
Beats = dict[tuple[str, str], dict[str, Any]]


def heard(body: Any, message: Any, reader: Identity) -> dict[str, Any] | None:
    """The beat ``message`` brings, as ``reader`` believes it (``None``: dropped, and logged why); acked."""
    try:
        return read_heartbeat(body, (message.properties or {}).get("user_id"), reader)
    except ValueError as exc:
        logger.warning("dropped a heartbeat: %s", exc)
        return None
    finally:
        message.ack()


def dropped(message: Any, exc: Exception) -> None:
    """A beat kombu cannot decode (not JSON): dropped, and the listener goes on."""
    logger.warning("dropped a heartbeat that is not JSON: %s", exc)
    message.ack()


def listen(app: Any, seconds: float, listener: str, service: str | None = None) -> Beats:
    """The latest heartbeat of each online worker (of ``service`` only, if given) heard within ``seconds``."""
    beats: Beats = {}
    reader = app.context.identity

    def on_beat(body: Any, message: Any) -> None:
        beat = heard(body, message, reader)
        if beat is None or (service is not None and beat["service"] != service):
            return
        key = (beat["service"], beat["worker"])
        if beat["state"] == "online":
            beats[key] = beat
        else:
            beats.pop(key, None)

    end = time.monotonic() + seconds
    queue = heartbeats_listener(app.service, listener, app.events_settings)
    with (
        app.connection_for_read() as connection,
        connection.Consumer(queue, callbacks=[on_beat], on_decode_error=dropped, accept=["json"]),
    ):
        while time.monotonic() < end:
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=max(0.05, min(1.0, end - time.monotonic())))
    return beats
