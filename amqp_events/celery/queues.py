"""The queues a worker of an events app consumes: its service's event queues, in Celery's queue table (the
partitions of ordered handlers excepted: :mod:`amqp_events.celery.partitions` consumes them).

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_celery_compat.py, tests/broker/test_handler_loading.py).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from celery.app.amqp import AMQP, Queues
from kombu.utils.objects import cached_property

from amqp_events.topology.names import is_partition_queue


class EventQueues(Queues):  # type: ignore[misc]
    """Celery's queue table of a worker, kept in step with the service's handlers.

    Upstream: ``WorkController.setup_instance`` reads ``app.amqp.queues``
    (``setup_queues``) *before* it imports the modules named by
    ``celery worker --include`` (``setup_includes``), and the table is
    cached. A handler registered afterwards would never be consumed, so the
    event queues are added again whenever Celery asks which queues to
    consume, or looks up a queue by name (``-Q``).
    """

    app: Any

    @property
    def consume_from(self) -> Mapping[str, Any]:
        self.add_event_queues()
        return super().consume_from  # type: ignore[no-any-return]

    def __missing__(self, name: str) -> Any:
        self.add_event_queues()
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        return super().__missing__(name)

    def add_event_queues(self) -> None:
        # Without -Q a worker consumes every queue of the table: the table itself (5.5), or a copy of it
        # made when it was built (5.6+), which needs the new queue too.
        consumed_by_default = getattr(self, "_default_consume_from", None) if self._consume_from is None else None
        for queue in self.app.topology.event_queues:
            if is_partition_queue(queue.name, self.app.service):  # each on a channel of its own (partitions.py)
                continue
            if not dict.__contains__(self, queue.name):
                # The worker declares its topology on every connection, before consuming (EventConsumer.connect),
                # keeping a queue an earlier version made without the replica-placement arguments: Celery's own
                # declaration, with every argument, would then be refused. A copy: the topology still declares it.
                queue = copy.copy(queue)
                queue.no_declare = True
                self[queue.name] = queue
                if consumed_by_default is not None:
                    consumed_by_default[queue.name] = queue


class EventsAMQP(AMQP):  # type: ignore[misc]
    """Celery's AMQP helper of an events app: its queues are the service's event queues (and ``task_queues``).

    Upstream: ``AMQP.queues`` builds the table from ``task_queues``, adding
    Celery's default ``celery`` queue when it is empty; a worker of a
    service would then consume ``celery`` instead of its event queues.
    """

    @cached_property
    def queues(self) -> EventQueues:
        app = self.app
        conf = app.conf
        table = EventQueues(
            conf.task_queues or (),
            default_exchange=self.default_exchange,
            create_missing=conf.task_create_missing_queues,
            autoexchange=self.autoexchange,
            max_priority=conf.task_queue_max_priority,
            default_routing_key=conf.task_default_routing_key,
        )
        table.app = app
        table.add_event_queues()
        return table
