"""Remote control of an events app's workers (``amqp-events breakers open|close``, ``archive parked``), as
Celery control commands, registered when an app is made (:func:`register`).

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_breakers.py).
"""

from __future__ import annotations

from typing import Any

from celery.app.control import Control
from celery.worker.control import Panel, control_command

from amqp_events.celery.pool import control as pool_control
from amqp_events.celery.steps import breakers_of
from amqp_events.errors import SteeringError
from amqp_events.topology.names import control_namespace

COMMAND = "amqp_events_breaker"
PARKED = "amqp_events_parked"


def register() -> None:
    """Make the commands known to the workers of this process (Celery keeps one table per process), and Celery's
    own as the consuming pool answers them (:mod:`amqp_events.celery.pool.control`)."""
    pool_control.install()
    if COMMAND not in Panel.data:
        control_command(
            args=[("service", str), ("handler", str), ("action", str)],
            signature="<service> <handler> <open|close>",
        )(amqp_events_breaker)
    if PARKED not in Panel.data:
        control_command(args=[("service", str)], signature="<service>")(amqp_events_parked)


def amqp_events_parked(state: Any, service: str) -> dict[str, Any]:
    """The parked keys of the partitions this worker consumes (those it read since it connected)."""
    runner = getattr(state.consumer, "ordered_runner", None)
    if getattr(state.consumer.app, "service", None) != service or runner is None:
        return {"service": getattr(state.consumer.app, "service", None), "partitions": {}}
    parked = runner.parking.parked()
    return {
        "service": service,
        "partitions": {
            partition: {key: {"head": sequence.head, "waiting": sequence.parked} for key, sequence in keys.items()}
            for partition, keys in parked.items()
        },
    }


def amqp_events_breaker(state: Any, service: str, handler: str, action: str) -> dict[str, Any]:
    """Hold a handler's breaker open, or release it.

    Every worker on the vhost receives the broadcast; those of other services ignore it.
    """
    app = state.consumer.app
    if getattr(app, "service", None) != service:
        return {"service": getattr(app, "service", None), "matched": []}
    breakers = breakers_of(app)
    if breakers is None:
        return {"service": service, "matched": []}
    matched = breakers.matching(handler)
    if action == "open":
        breakers.hold(handler)
    elif action == "close":
        breakers.release(handler)
    else:
        return {"service": service, "error": f"unknown action {action!r} (open or close)"}
    names = [breakers.handlers[task].name for task in matched]
    return {"service": service, "matched": names, "action": action}


def steer(
    app: Any, service: str, handler: str, action: str, wait: float = 3.0, expected: int = 0
) -> dict[str, list[str]]:
    """Hold ``handler``'s breaker open (``open``) or release it (``close``) in every live worker of ``service``;
    returns the handlers each worker that has it matched, by worker. Replies are awaited for ``wait`` seconds, or
    until ``expected`` workers (those known to be online: 0, not known) have answered."""
    replies = control_of(app, service).broadcast(
        COMMAND,
        arguments={"service": service, "handler": handler, "action": action},
        reply=True,
        timeout=wait,
        limit=expected or None,
    )
    matched = {}
    for reply in replies:
        for worker, answer in reply.items():
            if not isinstance(answer, dict) or answer.get("service") != service:
                continue
            if answer.get("error"):
                raise SteeringError(f"{worker}: {answer['error']}")
            if answer.get("matched"):
                matched[worker] = list(answer["matched"])
    return matched


def parked(app: Any, service: str, wait: float = 3.0) -> dict[str, dict[str, dict[str, Any]]]:
    """The parked keys of ``service``'s partitions, by partition and key (``{"head": id, "waiting": n}``; the
    key ``""``: a history replay's gate), as the workers consuming them answer."""
    replies = control_of(app, service).broadcast(PARKED, arguments={"service": service}, reply=True, timeout=wait)
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for reply in replies:
        for answer in reply.values():
            if isinstance(answer, dict) and answer.get("service") == service:
                found.update(answer["partitions"])
    return found


def control_of(app: Any, service: str) -> Any:
    """Celery's remote control of ``service``'s workers, through ``app``'s connection: each service's workers
    listen on a mailbox of their own (:func:`~amqp_events.topology.names.control_namespace`)."""
    if service == app.service:
        return app.control
    return ServiceControl(app, service)


class ServiceControl(Control):  # type: ignore[misc]
    """Upstream: ``Control`` names its mailbox after ``app.conf.control_exchange`` (and which options it passes
    differs between Celery 5.5 and 5.6); this one is the same mailbox, renamed for another service's workers."""

    def __init__(self, app: Any, service: str) -> None:
        super().__init__(app)
        mailbox = self.mailbox
        mailbox.namespace = control_namespace(service)
        mailbox.exchange = mailbox._get_exchange(mailbox.namespace, mailbox.type)
        mailbox.reply_exchange = mailbox._get_reply_exchange(mailbox.namespace)
