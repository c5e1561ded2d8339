"""Which queue a worker's message came from, by its consumer tag: what the router chooses its handler by.

Upstream (kombu 5.3 to 5.7): a ``Consumer`` keeps each consumed queue's tag in ``_active_tags`` (queue name ->
tag) and drops it when the queue is cancelled (a paused handler, Celery's ``cancel_consumer``), while a message
delivered just before may still be on its way with that tag. So the tags seen are remembered for as long as the
consumer lives (a new connection's consumer numbers its tags afresh).
"""

from __future__ import annotations

from typing import Any


class ConsumedQueues:
    """The queue of each consumer tag of a worker's task consumer."""

    def __init__(self) -> None:
        self._consumer: Any = None
        self._queues: dict[Any, str] = {}

    def of(self, consumer: Any, tag: Any) -> str | None:
        """The queue ``consumer`` consumed under ``tag`` (``None``: never seen, so not known)."""
        if consumer is not self._consumer:
            self._consumer, self._queues = consumer, {}
        queue = self._queues.get(tag)
        if queue is None:
            tags = getattr(consumer, "_active_tags", None)
            if tags is None:  # never guess: another handler would run the message in its handler's place
                raise LookupError(
                    "kombu's consumer keeps no consumer tags: cannot tell which queue a message came from"
                )
            self._queues.update({known: name for name, known in tags.items()})
            queue = self._queues.get(tag)
        return queue
