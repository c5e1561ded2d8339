"""Listening to the workers' heartbeats (``amqp_events.heartbeats``): who is online, and their breakers' and
health checks' states, as the CLI's ``breakers`` command and the console show them."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from amqp_events.topology.layout import heartbeats_listener

#: A worker's latest heartbeat, by ``(service, worker)``.
Beats = dict[tuple[str, str], dict[str, Any]]


def listen(app: Any, seconds: float, listener: str, service: str | None = None) -> Beats:
    """The latest heartbeat of each online worker (of ``service`` only, if given) heard within ``seconds``."""
    beats: Beats = {}

    def heard(body: Any, message: Any) -> None:
        beat = body if isinstance(body, dict) else json.loads(body)
        if service is None or beat.get("service") == service:
            key = (str(beat.get("service")), str(beat.get("worker")))
            if beat.get("state") == "online":
                beats[key] = beat
            else:
                beats.pop(key, None)
        message.ack()

    end = time.monotonic() + seconds
    queue = heartbeats_listener(app.service, listener, app.events_settings)
    with app.connection_for_read() as connection, connection.Consumer(queue, callbacks=[heard], accept=["json"]):
        while time.monotonic() < end:
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=max(0.05, min(1.0, end - time.monotonic())))
    return beats
