"""The seam between a replay and live events for ordered handlers: a gate in each partition.

Without it, a key's live event could run before an older event of the same
key that the replay has not sent yet. So a replay to ordered handlers first
declares the service's partitions without what brings them live events,
sends each a command that closes its gate (the first message a partition
gets from then on), then lets live events in: a worker holds them behind
the gate (:mod:`amqp_events.ordering.parking`) until the replay sends the
command that opens it, after its last event. Events a worker handled before
the replay began (the partitions existed) may still run before older
replayed ones: a replay says so.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from amqp_events.core.context import ServiceContext
from amqp_events.core.handler import Handler
from amqp_events.errors import TopologyMissing
from amqp_events.topology import Topology
from amqp_events.topology.names import ordered_exchange_name, partition_queue_name, to_queue
from amqp_events.wire.message import EMPTY_EMBED, EVENT_KEY, JSON, OutgoingMessage, json_body
from amqp_events.wire.parked import HOLD_LIVE, RELEASE_PARKED

logger = logging.getLogger(__name__)


def without_live_events(topology: Topology) -> Topology:
    """``topology`` without the bindings that bring the ordered exchange its live events (and delayed fires)."""
    ordered = ordered_exchange_name(topology.service)
    return replace(
        topology,
        bindings=tuple(
            binding
            for binding in topology.bindings
            if not (binding.to_exchange and binding.destination.name == ordered)
        ),
    )


def partitions_existed(context: ServiceContext) -> bool:
    """Did the service's first partition exist already (so workers may have handled live events)?"""
    try:
        context.transport.count(partition_queue_name(context.name, 0))
    except TopologyMissing:  # a new service
        return False
    logger.warning(
        "%s's ordered handlers had partitions before this replay: events their workers handled before it began "
        "may have run before older events of their keys it replays",
        context.name,
    )
    return True


def close_gates(context: ServiceContext, handler: Handler, gate: str) -> None:
    """Each partition holds the events that do not come from replay ``gate`` from now on."""
    _command(context, handler, gate, HOLD_LIVE)


def open_gates(context: ServiceContext, handler: Handler, gate: str) -> None:
    """Replay ``gate`` is done: what each partition held goes on, in order."""
    _command(context, handler, gate, RELEASE_PARKED)


def _command(context: ServiceContext, handler: Handler, gate: str, header: str) -> None:
    for partition in range(context.settings.partitions):
        queue = partition_queue_name(context.name, partition)
        # Dispatched to an ordered handler's task (any: a command runs nothing), in no key's lane.
        headers = {"task": handler.event, "id": f"{gate}-{header}-{partition:02d}", EVENT_KEY: "", header: gate}
        body = json_body([[], {}, EMPTY_EMBED])
        message = OutgoingMessage(*to_queue(queue), headers, body, headers["id"], JSON, "utf-8")
        if not context.transport.publish(message):
            raise LookupError(f"partition {queue!r} is gone: declare the service's topology again")
