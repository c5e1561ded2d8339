"""The in-process mode's prefetch of a limited handler's queue, as a worker's consumer has it
(:func:`~amqp_events.limits.waiting.limited_prefetch`): while its worker holds as many of the queue's messages as
the prefetch allows (events over their limit, run again on the virtual clock), the queue gives it no other."""

from __future__ import annotations

from collections.abc import Iterable

from amqp_events.core.context import ServiceContext
from amqp_events.limits.waiting import keyed_limit, limited_prefetch
from amqp_events.testing.in_process.transport import MemoryChannel


class Prefetch:
    """The limited queues' prefetch, and the messages their worker holds unsettled."""

    def __init__(self) -> None:
        self.limits: dict[str, int] = {}
        self.held: dict[str, list[MemoryChannel]] = {}

    def add(self, context: ServiceContext, queue: str) -> None:
        prefetch = limited_prefetch(keyed_limit(context, queue), 1)  # a solo worker: one run at a time
        if prefetch is not None:
            self.limits[queue] = prefetch

    def taken(self, queue: str, channel: MemoryChannel) -> None:
        """The worker keeps ``channel``'s message unsettled, to run it again later."""
        if queue in self.limits:
            self.held.setdefault(queue, []).append(channel)

    def consumable(self, queues: Iterable[str]) -> list[str]:
        """Of ``queues``, those whose worker may take another message now."""
        found = []
        for queue in queues:
            held = self.held[queue] = [channel for channel in self.held.get(queue, ()) if not channel.settled]
            if len(held) < self.limits.get(queue, len(held) + 1):
                found.append(queue)
        return found
