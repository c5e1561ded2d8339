"""A service's place on the broker: its exchanges, queues and bindings, and the delay ladder they share.

* :mod:`~amqp_events.topology.names`: service, event and queue names;
* :mod:`~amqp_events.topology.delays`: the delay ladder's routing keys (pure maths);
* :mod:`~amqp_events.topology.layout`: the topology as plain kombu ``Exchange``/``Queue`` objects (pure);
* :mod:`~amqp_events.topology.check`: comparing it with what a live broker has.

Declaring it on a live broker, reading what one has and retiring it are the
transport's (:mod:`~amqp_events.transport.declare`, :mod:`~amqp_events.transport.management`,
:mod:`~amqp_events.transport.retire`).
"""

from amqp_events.topology.layout import Binding, Topology
from amqp_events.topology.names import (
    archive_queue_name,
    check_event_name,
    check_service_name,
    event_queue_name,
    ordered_exchange_name,
    parked_queue_name,
    partition_queue_name,
    to_queue,
)
from amqp_events.topology.service import service_topology

__all__ = [
    "Binding",
    "Topology",
    "archive_queue_name",
    "check_event_name",
    "check_service_name",
    "event_queue_name",
    "ordered_exchange_name",
    "parked_queue_name",
    "partition_queue_name",
    "service_topology",
    "to_queue",
]
