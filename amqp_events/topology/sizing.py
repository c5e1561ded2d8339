"""What quorum queues cost a RabbitMQ node, from measurements (pure): the figures `topology check` and the
exporter warn with, and the reference on sizing quotes.

Measured on a 2-core machine with RabbitMQ 3.10.8, each queue declared by ``amqp-events topology declare`` on a
local three-node cluster (``amqp_events.local``), idle: every quorum queue is a Raft group with a member on each
node, so each figure is per queue and per node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: Resident memory of one idle quorum queue member, in KB (159 measured; 115 after a full GC; 217 after the node
#: restarted; deleting queues does not give it back).
KB_PER_QUEUE = 159
#: A node's start until it accepts AMQP: 5.8 s empty, then about 5.3 ms per quorum queue member.
START_SECONDS = 5.8
SECONDS_PER_QUEUE = 0.0053
#: Idle CPU of a node, in percent of one core per 1,000 quorum queue members (14% at 4,103 on one node).
CPU_PERCENT_PER_THOUSAND = 3.4
#: RabbitMQ's own guidance: beyond about this many quorum queues, review the topology.
RABBITMQ_GUIDANCE = 5000


def quorum_queues(listing: Iterable[Mapping[str, Any]]) -> int:
    """How many of a management API's queue records are quorum queues."""
    return sum(1 for queue in listing if queue.get("type") == "quorum")


def cost(queues: int) -> str:
    """What ``queues`` quorum queues cost each node, in words."""
    megabytes = queues * KB_PER_QUEUE / 1024
    restart = START_SECONDS + queues * SECONDS_PER_QUEUE
    cpu = queues * CPU_PERCENT_PER_THOUSAND / 1000
    return f"about {megabytes:,.0f} MB of memory, {cpu:.0f}% of a core idle and {restart:.0f} s to restart, per node"
