"""What a worker says as it starts about what it will not do as configured: time limits its pool does not enforce,
authors it cannot verify, limited handlers whose backlog cannot wait in a queue of their own."""

from __future__ import annotations

import logging
from typing import Any

from amqp_events.core.context import ServiceContext
from amqp_events.coroutines import is_coroutine_handler
from amqp_events.limits.options import limits_of

logger = logging.getLogger(__name__)


def warn_of_unverified_authors(context: ServiceContext) -> None:
    """Event ownership needs a verified author: a user of the service's own, which a shared user is not."""
    identity = context.identity
    if context.settings.event_ownership and not identity.verified:
        logger.warning(
            "event ownership is on, but this worker's RabbitMQ user %r stands for no service %r (name it in "
            "amqp_events_service_users, or give the service a user of its own): a user shared by several services "
            "tells none of them apart, so no author is verified and ownership is not checked",
            identity.user,
            context.name,
        )


def warn_of_time_limits(app: Any, pool: Any) -> None:
    """Upstream: only the prefork pool enforces Celery's time limits; with the others they silently do nothing."""
    if type(pool).__module__ == "celery.concurrency.prefork" or getattr(pool, "enforces_time_limits", False):
        return
    conf = app.conf
    limited = sorted(
        task.name
        for task in app.event_handlers()
        # a coroutine handler's soft time limit cancels it (asyncio), whatever the pool
        if task.time_limit
        or conf.task_time_limit
        or ((task.soft_time_limit or conf.task_soft_time_limit) and not is_coroutine_handler(task.handler.function))
    )
    if limited:
        logger.warning(
            "time_limit/soft_time_limit of %s: the %s pool does not enforce them (prefork and the consuming pool "
            "do); a handler runs until it returns",
            ", ".join(limited),
            type(pool).__module__.rsplit(".", 1)[-1],
        )


def warn_of_shared_limited_queues(context: ServiceContext) -> None:
    """A limited handler's backlog waits in its queue when the queue is its own (``per_handler``, the default): a
    queue it shares with handlers without a limit (``per_service``) is consumed at the worker's prefetch, and what
    the worker cannot hold waits on the service's own delay ladder."""
    for queue in sorted({handler.queue for handler in context.handlers.values()}):
        handlers = context.takers(queue)
        limited = sorted(handler.name for handler in handlers if limits_of(handler))
        if limited and len(limited) < len(handlers):
            logger.warning(
                "%s share queue %s with handlers without a limit (amqp_events_queue_layout = 'per_service'): past "
                "what the worker holds, their events over the limit wait on the service's delay ladder, not in the "
                "queue's order. The per_handler layout gives each its own queue",
                ", ".join(limited),
                queue,
            )
