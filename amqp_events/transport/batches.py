"""Publishing many messages with their confirms collected together (pipelined), over a connection of its own.

Confirms, nacks and returns are read from py-amqp's channel callbacks (``basic_ack``, ``basic_nack``,
``basic_return``), checked on py-amqp 5.4.2 with kombu 5.5.4 to 5.7.0 (tests/broker/test_batch.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from amqp.exceptions import ChannelError, PreconditionFailed
from kombu.exceptions import OperationalError

from amqp_events.errors import MessageRefused, PublishError
from amqp_events.transport.publisher import (
    FIRST_PAUSE,
    MAX_PAUSE,
    Connections,
    checks_shared,
    exchange_to_declare,
    read_only_for_confirms,
    send,
)
from amqp_events.wire.message import OutgoingMessage

logger = logging.getLogger(__name__)


class ConfirmedBatchPublisher:
    """Publishes many messages and awaits their broker confirms together (pipelined).

    One confirm per message costs a network round trip each; keeping up to
    ``window`` messages in flight and collecting their confirms as they come
    removes that wait. Uses a connection of its own, closed by :meth:`close`.

    When the connection fails (its node died), the batch goes on over a new
    connection to the next of the broker's hosts and publishes again every
    message not yet confirmed: a duplicate at worst, never a loss. Messages
    the broker refused (a quorum queue electing a new leader nacks them) are
    published again too, with a growing pause, until ``timeout``; only then
    are they :attr:`refused`. If no host answers within ``timeout``,
    :class:`PublishError` lists what may be missing.
    """

    def __init__(self, app: Connections, timeout: float, window: int = 2000) -> None:
        self.timeout, self.window = timeout, window
        self.passive = checks_shared(app)
        self.connection = app.connection_for_write(transport_options={"confirm_publish": False})
        self._errors = (*self.connection.connection_errors, OperationalError)
        #: Delivery tag -> (key, message) of what the broker has not confirmed yet, oldest first.
        self._pending: dict[int, tuple[Any, OutgoingMessage]] = {}
        #: What the broker refused so far, to be published again.
        self._nacked: list[tuple[Any, OutgoingMessage]] = []
        #: Keys of the messages the broker confirmed, in order (a key is the message id unless given).
        self.confirmed: list[Any] = []
        #: Keys of the messages the broker refused (nack).
        self.refused: list[Any] = []
        #: Ids no queue received (returned as unroutable).
        self.returned: set[str] = set()
        #: How many times the connection failed and the batch went on over another one.
        self.failovers = 0
        self._open(time.monotonic() + timeout)

    def publish(self, message: OutgoingMessage, key: Any = None) -> None:
        """Send ``message`` without waiting for its confirm (at most ``window`` are in flight);
        :class:`~amqp_events.errors.MessageRefused` when the broker closed the channel over one."""
        with _closed_channel_is_refused():
            self._publish(message, key)

    def _publish(self, message: OutgoingMessage, key: Any) -> None:
        entry = (message.message_id if key is None else key, message)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self._declare_exchange_of(message)
                send(self.channel, message)
                break
            except self._errors as exc:
                self._fail_over(exc, deadline)
        self._pending[self._next_tag] = entry
        self._next_tag += 1
        if len(self._pending) >= self.window:
            self._drain(until=self.window // 2)

    def wait(self) -> None:
        """Wait until the broker confirmed everything sent so far (or refused it until ``timeout``)."""
        with _closed_channel_is_refused():
            self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + self.timeout
        pause = FIRST_PAUSE
        self._drain(until=0)
        while self._nacked and time.monotonic() + pause < deadline:
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE)
            self._reopen_channel(deadline)
            again, self._nacked = self._nacked, []
            for key, message in again:
                self._publish(message, key)
            self._drain(until=0)
        self.refused.extend(key for key, _ in self._nacked)
        self._nacked = []

    def results(self) -> tuple[list[Any], list[Any], set[str]]:
        """``(confirmed, refused, returned)`` since the last call, and forget them (to publish the next batch)."""
        results = (self.confirmed, self.refused, self.returned)
        self.confirmed, self.refused, self.returned = [], [], set()
        return results

    def close(self) -> None:
        self.connection.release()

    def _open(self, deadline: float) -> None:
        """Connect to the first of the broker's hosts that answers, then open a channel in confirm mode."""
        self.connection.ensure_connection(
            max_retries=max(1, len(self.connection.alt)) - 1,
            interval_start=0,
            timeout=max(0.1, deadline - time.monotonic()),
        )
        self.channel: Any = self.connection.channel()
        self.channel.confirm_select()
        read_only_for_confirms(self.channel)
        self._declared: set[str] = set()
        self._next_tag = 1  # delivery tags count per channel
        self.channel.events["basic_ack"].add(self._on_ack)
        self.channel.events["basic_nack"].add(self._on_nack)
        self.channel.events["basic_return"].add(self._on_return)

    def _reopen_channel(self, deadline: float) -> None:
        """A fresh channel: RabbitMQ 3.10 keeps nacking, for good, what a channel opened while a quorum
        queue had no leader publishes to that queue; a channel opened afterwards is fine."""
        with contextlib.suppress(*self._errors):
            self.channel.close()
        self._open(deadline)

    def _drain(self, until: int) -> None:
        deadline = time.monotonic() + self.timeout
        while len(self._pending) > until:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                ids = [str(key) for key, _ in self._pending.values()]
                raise PublishError(
                    f"the broker did not confirm {len(ids)} event(s) within {self.timeout:g}s: " + ", ".join(ids), ids
                )
            try:
                self.connection.drain_events(timeout=remaining)
            except TimeoutError:
                continue
            except self._errors as exc:
                self._fail_over(exc, deadline)

    def _fail_over(self, error: BaseException, deadline: float) -> None:
        """Open a connection to the next host that answers and publish again what is not confirmed."""
        unconfirmed = list(self._pending.values())
        pause = FIRST_PAUSE
        while time.monotonic() + pause < deadline:
            logger.warning(
                "a batch lost its connection (%s); resending %d unconfirmed event(s)", error, len(unconfirmed)
            )
            self.connection.collect()
            try:
                self._open(deadline)
                self._pending = {}
                for key, message in unconfirmed:
                    self._declare_exchange_of(message)
                    send(self.channel, message)
                    self._pending[self._next_tag] = (key, message)
                    self._next_tag += 1
            except self._errors as exc:
                error = exc
                time.sleep(pause)
                pause = min(pause * 2, MAX_PAUSE)
                continue
            self.failovers += 1
            return
        ids = [str(key) for key, _ in unconfirmed]
        raise PublishError(
            f"the connection failed during a batch ({error}) and no host answered within {self.timeout:g}s; "
            "these event(s) may not have been delivered: " + ", ".join(ids),
            ids,
        ) from error

    def _declare_exchange_of(self, message: OutgoingMessage) -> None:
        exchange = exchange_to_declare(message, self.passive) if message.exchange not in self._declared else None
        if exchange is not None:
            exchange.declare(channel=self.channel)
            self._declared.add(exchange.name)

    def _settle(self, tag: int, multiple: bool) -> list[tuple[Any, OutgoingMessage]]:
        settled = []
        for pending in list(self._pending) if multiple else [tag]:
            if pending > tag:
                break
            entry = self._pending.pop(pending, None)
            if entry is not None:
                settled.append(entry)
        return settled

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self.confirmed.extend(key for key, _ in self._settle(tag, multiple))

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._nacked.extend(self._settle(tag, multiple))

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        self.returned.add(message.properties.get("message_id"))


@contextlib.contextmanager
def _closed_channel_is_refused() -> Iterator[None]:
    try:
        yield
    except ChannelError as exc:  # the channel is gone with it: the caller starts another batch
        raise MessageRefused(f"the broker closed the channel: {exc}", isinstance(exc, PreconditionFailed)) from exc
