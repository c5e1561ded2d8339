"""``amqp-events topology move``: a service's queues moved into the layout its settings name, no event lost.

Run it with the service's workers of the old layout stopped (what one of them
holds unacked would go back to a queue no worker reads); then start the
workers of the new layout. A message is removed from its old queue only once
the broker confirmed its copies in the new one: stopped half-way, a move loses
nothing and can run again. An event fired in the moment between binding the new
queues and unbinding the old ones reaches both, and runs twice (once with an
inbox).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from amqp_events.core.context import ServiceContext
from amqp_events.errors import PublishError, TopologyMissing
from amqp_events.topology.moving import Move, Target, move_to
from amqp_events.topology.names import to_queue
from amqp_events.wire.message import FOR_HANDLER, OutgoingMessage, StoredMessage, copy_headers, event_id, event_name
from amqp_events.wire.trust import Identity, vouch

logger = logging.getLogger(__name__)

#: Copies published before their confirms are awaited and their originals removed.
WINDOW = 500


@dataclass
class Moved:
    """What a move did: messages moved out of each old queue, the queues deleted, and those kept with why."""

    layout: str
    moved: dict[str, int] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)


def move_layout(context: ServiceContext, rabbitmq: Any) -> Moved:
    """Declare ``context``'s topology in its layout, route what reached the other layout's queues to it, move
    their messages, delete them when empty and unread."""
    handlers = context.handlers
    tasks = {task: (handler.event, handler.queue) for task, handler in handlers.items()}
    ordered = [task for task, handler in handlers.items() if handler.ordered]
    move, topology = move_to(context.name, tasks, context.settings, ordered)
    rabbitmq.declare(topology)
    report = Moved(move.layout)
    for old in move.old:
        try:
            context.transport.count(old.name)
        except TopologyMissing:  # never made, or moved already
            continue
        rabbitmq.rebind(bind=old.redirects, unbind=old.routes)
        report.moved[old.name] = _move_messages(context, move, old.name)
        why = rabbitmq.delete_if_idle(old.name)
        if why is None:
            report.deleted.append(old.name)
        else:
            report.kept[old.name] = why
        logger.info(  # the command line says it too
            "service %s moved to the %s layout: %d message(s) of %s moved, %s",
            context.name, move.layout, report.moved[old.name], old.name, why or "the queue deleted",
        )  # fmt: skip
    return report


def _move_messages(context: ServiceContext, move: Move, queue: str) -> int:
    """Copy every message of ``queue`` to the queues of the handlers it is for, then remove it; returns how many."""
    transport = context.transport
    moved = 0
    with transport.browse(queue) as messages:
        publisher = transport.batch(WINDOW)
        waiting: list[Callable[[], None]] = []
        try:
            for stored, remove in messages:
                for copy in copies_of(
                    stored, move.destinations(queue, stored.headers, event_name(stored.headers)), move, context.identity
                ):
                    publisher.publish(copy)
                waiting.append(remove)
                if len(waiting) >= WINDOW:
                    moved += _confirmed(publisher, waiting)
            moved += _confirmed(publisher, waiting)
        finally:
            publisher.close()
    return moved


def copies_of(
    stored: StoredMessage, targets: list[Target], move: Move, identity: Identity | None = None
) -> list[OutgoingMessage]:
    """A copy of ``stored`` for each of ``targets``, naming it; one as it is for the worker to archive (with the
    reason why) when no handler of the service takes it. ``identity``: the service's, which keeps only what it may
    believe of a message another user sent (:mod:`amqp_events.wire.trust`): the copies are its own."""
    if identity is not None:
        believed = dict(stored.headers)
        vouch(identity, stored.user_id, believed)
        stored = replace(stored, headers=believed)
    retries = stored.headers.get("retries")
    count = retries if isinstance(retries, int) and retries >= 0 else 0
    if not targets:
        queue = min(target.queue for target in move.targets.values())
        addressed = [(queue, dict(stored.headers))]
    else:
        addressed = [
            (target.queue, copy_headers(stored.headers, count, task=target.task, **{FOR_HANDLER: target.task}))
            for target in targets
        ]
    return [
        OutgoingMessage(
            *to_queue(queue),
            headers,
            stored.body,
            event_id(stored.headers),
            stored.content_type or "application/octet-stream",
            stored.content_encoding or "binary",
        )
        for queue, headers in addressed
    ]


def _confirmed(publisher: Any, waiting: list[Callable[[], None]]) -> int:
    """Wait for the confirms of what was published, then remove the originals; returns how many."""
    publisher.wait()
    _, refused, returned = publisher.results()
    if refused or returned:
        raise PublishError(
            f"{len(refused)} copies refused by the broker, {len(returned)} routed nowhere: the move stops (the "
            "originals stay in their queue; run it again)"
        )
    for remove in waiting:
        remove()
    done = len(waiting)
    waiting.clear()
    return done
