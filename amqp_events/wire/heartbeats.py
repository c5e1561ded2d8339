"""Workers' heartbeats on ``amqp_events.heartbeats``: what a worker says of itself (who it is, its breakers and
health checks), and what a listener (``amqp-events breakers``, the console, the exporter) believes of it.

Any service may write to the heartbeats exchange, so a beat is believed only from a user that stands for the
service it names (:meth:`amqp_events.wire.trust.Identity.believes`), and only in the shape a worker sends;
anything else is dropped by the listener, which goes on. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from amqp_events.wire.trust import Identity

#: A beat's states: the worker is up, or has just stopped.
STATES = ("online", "offline")


def heartbeat(
    service: str,
    worker: str,
    state: str,
    now: float,
    breakers: Mapping[str, str] | None = None,
    health: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The body of a beat of ``worker`` of ``service`` at ``now`` (seconds since the epoch)."""
    beat: dict[str, Any] = {"service": service, "worker": worker, "state": state, "time": now}
    if breakers is not None:
        beat["breakers"], beat["health"] = dict(breakers), dict(health or {})
    return beat


def read_heartbeat(body: Any, user_id: Any, reader: Identity) -> dict[str, Any]:
    """The beat in ``body`` (JSON text, or decoded), sent by ``user_id``, as ``reader`` believes it;
    ``ValueError`` says why it is dropped instead."""
    beat = json.loads(body) if isinstance(body, str | bytes) else body
    if not isinstance(beat, dict):
        raise ValueError(f"a heartbeat is a JSON object, not {type(beat).__name__}")
    service, worker, state, time = (beat.get(name) for name in ("service", "worker", "state", "time"))
    if not (isinstance(service, str) and isinstance(worker, str) and state in STATES):
        raise ValueError("a heartbeat names its service and worker (strings) and a state (online or offline)")
    if not isinstance(time, int | float) or isinstance(time, bool):
        raise ValueError("a heartbeat's time is a number")
    tables = {name: beat.get(name) or {} for name in ("breakers", "health")}
    if not all(_strings_by_name(table) for table in tables.values()):
        raise ValueError("a heartbeat's breakers and health are tables of states by name")
    if not reader.believes(user_id, service):
        raise ValueError(f"it says it comes from {service!r}, but its RabbitMQ user {user_id!r} does not stand for it")
    return {"service": service, "worker": worker, "state": state, "time": float(time), **tables}


def _strings_by_name(table: Any) -> bool:
    return isinstance(table, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in table.items())
