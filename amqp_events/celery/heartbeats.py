"""Listening to the workers' heartbeats (``amqp_events.heartbeats``): who is online, and their breakers' and
health checks' states, as the CLI's ``breakers`` command and the console show them. A beat that is malformed,
or comes from a user that does not stand for the service it names, is dropped with a log line
(:mod:`amqp_events.wire.heartbeats`)."""

from __future__ import annotations

import logging
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


def listen(app: Any, seconds: float, listener: str, service: str | None = None) -> Beats:
    """The latest heartbeat of each online worker (of ``service`` only, if given) heard within ``seconds``."""
    beats: Beats = {}
    reader = app.context.identity

    def on_beat(body: Any, properties: Mapping[str, Any]) -> None:
        beat = heard(body, properties, reader)
        if beat is None or (service is not None and beat["service"] != service):
            return
        key = (beat["service"], beat["worker"])
        if beat["state"] == "online":
            beats[key] = beat
        else:
            beats.pop(key, None)

    app.rabbitmq.listen(heartbeats_listener(app.service, listener, app.events_settings), on_beat, seconds)
    return beats
