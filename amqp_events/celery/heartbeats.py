"""Listening to the workers' heartbeats (``amqp_events.heartbeats``): who is online, and their breakers' and
health checks' states, as the CLI's ``breakers`` command and the console show them. A beat that is malformed,
or comes from a user that does not stand for the service it names, is dropped with a log line
(:mod:`amqp_events.wire.heartbeats`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from amqp_events.topology.layout import heartbeats_listener
from amqp_events.wire.heartbeats import read_heartbeat
from amqp_events.wire.trust import Identity

logger = logging.getLogger(__name__)

#: A worker's latest heartbeat, by ``(service, worker)``.
Beats = dict[tuple[str, str], dict[str, Any]]


def heard(body: Any, properties: Mapping[str, Any], reader: Identity) -> dict[str, Any] | None:
    """The beat ``body`` brings, as ``reader`` believes it (``None``: dropped, and logged why)."""
    try:
        return read_heartbeat(body, properties.get("user_id"), reader)
    except ValueError as exc:
        logger.warning("dropped a heartbeat: %s", exc)
        return None


class OnlineWorkers:
    """The latest heartbeat of each online worker, kept up to date beat by beat while listening: a worker is
    known from its first beat on, and forgotten when it says it stops or stays silent for three intervals."""

    def __init__(self, reader: Identity, interval: float, service: str | None = None) -> None:
        self.reader, self.interval, self.service = reader, interval, service
        self._beats: Beats = {}
        self._heard_at: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def on_beat(self, body: Any, properties: Mapping[str, Any]) -> None:
        beat = heard(body, properties, self.reader)
        if beat is None or (self.service is not None and beat["service"] != self.service):
            return
        key = (beat["service"], beat["worker"])
        with self._lock:
            if beat["state"] == "online":
                self._beats[key], self._heard_at[key] = beat, time.monotonic()
            else:
                self._beats.pop(key, None)

    def current(self) -> Beats:
        """The workers heard within three intervals."""
        recent = time.monotonic() - 3 * self.interval
        with self._lock:
            return {key: beat for key, beat in self._beats.items() if self._heard_at[key] >= recent}


def follow(app: Any, workers: OnlineWorkers, listener: str, stop: threading.Event) -> None:
    """Keep ``workers`` up to date until ``stop`` is set (a broker that goes away raises: listen again)."""
    app.rabbitmq.listen(heartbeats_listener(app.service, listener, app.events_settings), workers.on_beat, stop=stop)


def listen(app: Any, seconds: float, listener: str, service: str | None = None) -> Beats:
    """The latest heartbeat of each online worker (of ``service`` only, if given) heard within ``seconds``."""
    workers = OnlineWorkers(app.context.identity, app.events_settings.heartbeat_interval, service)
    queue = heartbeats_listener(app.service, listener, app.events_settings)
    app.rabbitmq.listen(queue, workers.on_beat, seconds)
    return workers.current()
