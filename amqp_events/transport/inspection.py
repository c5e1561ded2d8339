"""What the operator's tools read off the broker besides messages they keep: a queue listened to for a while (the
workers' heartbeats), queues' states by passive declares, and which broker and vhost an app's URL names.

The tools (the command line, the console, the exporter, the AsyncAPI document) reach the broker only through the
transport: kombu and py-amqp, and their errors, stay here.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from amqp.exceptions import NotFound, ResourceLocked
from kombu import Connection, Queue
from kombu.exceptions import OperationalError

logger = logging.getLogger(__name__)

#: A broker that cannot be reached (kombu's and the socket's): what an operator's tool reports in one line.
UNREACHABLE: tuple[type[BaseException], ...] = (OperationalError, ConnectionError)
#: What the broker answers for a queue or exchange that is not there (the transport raises ``TopologyMissing``).
MISSING: tuple[type[BaseException], ...] = (NotFound,)


def vhost_of(broker_url: str) -> str:
    """The virtual host ``broker_url`` names."""
    return str(Connection(broker_url).virtual_host or "/")


def address_of(broker_url: str) -> str:
    """``host:port`` of the broker ``broker_url`` names."""
    connection = Connection(broker_url)
    return f"{connection.hostname or 'localhost'}:{connection.port or 5672}"


def shown(broker_url: str) -> str:
    """``broker_url`` as it may be shown: without its password."""
    return str(Connection(broker_url).as_uri())


def listen(
    connect: Callable[[], Connection],
    queue: Queue,
    on_message: Callable[[Any, Mapping[str, Any]], None],
    seconds: float | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Consume ``queue`` (a queue of its own, bound while listening) for ``seconds`` or until ``stop`` is set,
    calling ``on_message(body, properties)`` for each JSON message, acked; one that is not JSON is logged and
    dropped."""

    def received(body: Any, message: Any) -> None:
        try:
            on_message(body, message.properties or {})
        finally:
            message.ack()

    def not_json(message: Any, exc: Exception) -> None:
        logger.warning("dropped a message of %s that is not JSON: %s", queue.name, exc)
        message.ack()

    end = None if seconds is None else time.monotonic() + seconds
    with (
        connect() as connection,
        connection.Consumer(queue, callbacks=[received], on_decode_error=not_json, accept=["json"]),
    ):
        while not (stop is not None and stop.is_set()) and (end is None or time.monotonic() < end):
            wait = 1.0 if end is None else max(0.05, min(1.0, end - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                connection.drain_events(timeout=wait)


def queue_states(connect: Callable[[], Connection], queues: Iterable[str]) -> dict[str, tuple[int, int]]:
    """``(ready messages, consumers)`` of each of ``queues`` that exists, by passive declares (one missing closes
    only its own channel; any other error is raised)."""
    found = {}
    with connect() as connection:
        for name in queues:
            channel: Any = connection.channel()
            try:
                ok = channel.queue_declare(name, passive=True)
            except NotFound:  # it closed the channel; the other queues go on
                continue
            channel.close()
            found[name] = (int(ok.message_count), int(ok.consumer_count))
    return found


def leases_held(connect: Callable[[], Connection], names: Iterable[str]) -> int:
    """How many of the flow-control leases ``names`` a run holds now (:mod:`amqp_events.transport.leases`): a
    passive declare of one is refused while another connection holds it, and finds nothing once it is back."""
    held = 0
    with connect() as connection:
        for name in names:
            channel: Any = connection.channel()
            try:
                channel.queue_declare(name, passive=True)
            except ResourceLocked:
                held += 1
                continue
            except NotFound:
                continue
            channel.close()  # a lease left by a connection not yet closed: it counts as held
            held += 1
    return held
