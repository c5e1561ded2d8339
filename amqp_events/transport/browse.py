"""Reading every message of a queue without taking it away: a *browse*.

AMQP 0-9-1 has no browse: one consumes every message unacked and closes the
channel, which gives back whatever was not acked (a removal is an ack). While
one browse holds a queue's messages, another would see it empty, so a browse
waits its turn: it starts once the queue has no consumer, and when two start at
the same moment each sees the other's consumer and one of them steps back.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from amqp.exceptions import AccessRefused

from amqp_events.errors import PermissionRefused
from amqp_events.transport.base import Browsed
from amqp_events.wire.message import StoredMessage

#: Seconds without a delivery after which a browse ends with fewer messages than the queue counted (some expired).
BROWSE_IDLE = 2.0
#: Seconds a browse waits for another one of the same queue to end (a console reading an archive of 10,000
#: messages holds it about a second).
BROWSE_TURN = 10.0
#: The most unacked messages one consumer of a browse takes: AMQP's prefetch count is 16 bits (and a quorum queue
#: gives a consumer without a limit 2,000 at most, not every message: a browse of 10,000 saw 2,000).
PREFETCH_MAX = 65_535
#: Longest pause (seconds) of a browse that stepped back for another that started at the same moment (random, so
#: that two which both stepped back do not meet again).
STEP_BACK = 0.1


@contextmanager
def browsing(connection: Any, queue: str) -> Iterator[Browsed]:
    """Every message of ``queue`` on ``connection``, each with the function that removes it; whatever is not
    removed goes back when the browse ends, and it ends once the broker counts it back in the queue (a quorum
    queue takes a moment), so that the next reading finds it."""
    removed: list[int] = []
    try:
        channels, taken, waiting = _consumed_alone(connection, queue)
    except AccessRefused as refused:  # reading it needs the read grant, counting it does not
        raise PermissionRefused(f"{refused.reply_text}: this user may not read {queue!r}") from None
    try:
        yield _take_all(connection, taken, waiting, removed)
    finally:
        for channel in channels:  # closing without a cancel first: the consumer leaves as its messages come back
            channel.close()
    _wait_until_back(connection, queue, waiting - len(removed))


def _may_read(channel: Any, queue: str) -> None:
    """An empty queue is read without taking anything, but only with the read grant, as a full one: a consumer
    started and cancelled asks the broker (counting it needs no grant). What it may take meanwhile goes back
    with the channel."""
    channel.basic_qos(0, 1, False)
    channel.basic_cancel(channel.basic_consume(queue, no_ack=False, callback=lambda message: None))


def _consumed_alone(connection: Any, queue: str) -> tuple[list[Any], deque[Any], int]:
    """Consumers of ``queue`` whose prefetch together covers its messages, started once no other browse runs
    (:data:`BROWSE_TURN` at most): their channels, the deliveries as they come and how many messages it holds."""
    deadline = time.monotonic() + BROWSE_TURN
    while True:
        first = connection.channel()
        waiting = _after_other_browses(first, queue, deadline)
        if not waiting:
            _may_read(first, queue)
            return [first], deque(), 0
        # One consumer takes at most PREFETCH_MAX unacked: as many consumers as it takes, each on its channel.
        channels = [first, *(connection.channel() for _ in range(1, math.ceil(waiting / PREFETCH_MAX)))]
        taken: deque[Any] = deque()
        for channel in channels:
            channel.basic_qos(0, min(waiting, PREFETCH_MAX), False)
            channel.basic_consume(queue, no_ack=False, callback=taken.append)
        # Another browse that counted no consumer at the same moment is a consumer now: of the two, the one that
        # sees the other steps back (both may: each tries again after a random pause).
        alone = first.queue_declare(queue, passive=True).consumer_count <= len(channels)
        if alone or time.monotonic() > deadline:
            return channels, taken, waiting
        for channel in channels:
            channel.close()
        time.sleep(random.uniform(0, STEP_BACK))


def _after_other_browses(channel: Any, queue: str, deadline: float) -> int:
    """The messages of ``queue`` once no one else browses it (a queue that is only browsed has no consumer but a
    browse), waiting until ``deadline`` at most."""
    declared = channel.queue_declare(queue, passive=True)
    while declared.consumer_count and time.monotonic() < deadline:
        time.sleep(0.02)
        declared = channel.queue_declare(queue, passive=True)
    return int(declared.message_count)


def _take_all(connection: Any, taken: deque[Any], waiting: int, removed: list[int]) -> Browsed:
    """The ``waiting`` messages as they are delivered into ``taken`` (a fetch per message would cost a round trip
    each: 10,000 archived messages took 10 s), none acked unless removed (each removal's tag is noted in
    ``removed``)."""
    given = 0
    while given < waiting:
        if not taken:
            try:
                connection.drain_events(timeout=BROWSE_IDLE)
            except TimeoutError:
                return
            continue
        fetched = taken.popleft()
        given += 1
        body = fetched.body if isinstance(fetched.body, bytes) else str(fetched.body).encode("utf-8")
        properties = fetched.properties  # py-amqp has no attribute for a property a message lacks
        headers = properties.get("application_headers")
        stored = StoredMessage(
            dict(headers) if isinstance(headers, dict) else {},
            body,
            properties.get("content_type"),
            properties.get("content_encoding"),
            properties.get("user_id"),
            fetched.delivery_info.get("exchange") or "",
            fetched.delivery_info.get("routing_key") or "",
        )
        yield stored, functools.partial(_remove, fetched.channel, fetched.delivery_tag, removed)


def _remove(channel: Any, delivery_tag: int, removed: list[int]) -> None:
    channel.basic_ack(delivery_tag)
    removed.append(delivery_tag)


def _wait_until_back(connection: Any, queue: str, expected: int) -> None:
    """Wait (a few seconds at most) until ``queue`` counts ``expected`` messages or more."""
    deadline = time.monotonic() + BROWSE_IDLE
    channel = connection.default_channel
    while channel.queue_declare(queue, passive=True).message_count < expected and time.monotonic() < deadline:
        time.sleep(0.02)
