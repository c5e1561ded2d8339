"""Putting messages on the broker: persistent, mandatory, confirmed, in bounded time."""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

from celery import Celery
from kombu import Exchange, Producer

from amqp_events.message import OutgoingMessage

logger = logging.getLogger(__name__)

PERSISTENT = 2


class PublishError(RuntimeError):
    """The broker could not be reached, or did not confirm a message, in time."""


class Publisher:
    """Publishes :class:`OutgoingMessage` objects through a Celery app's producer pool.

    Every message is persistent and published with the ``mandatory`` flag on
    a channel in confirm mode, so :meth:`publish` returns only once the
    broker has taken responsibility for it, and knows whether any queue got
    it. A broker that is down or does not confirm makes it raise
    :class:`PublishError` after ``timeout`` seconds.
    """

    def __init__(self, app: Celery, timeout: float, declare: tuple[Exchange, ...] = ()) -> None:
        self.app = app
        self.timeout = timeout
        #: Exchanges a publisher may need before any worker declared them (declared once per connection).
        self.declare = list(declare)
        self._returned: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()

    def publish(self, message: OutgoingMessage) -> bool:
        """Publish ``message``; ``True`` if a queue received it, ``False`` if it was unroutable."""
        deadline = time.monotonic() + self.timeout

        with self.app.producer_pool.acquire(block=True, timeout=self.timeout) as producer:
            connection = producer.connection
            assert connection is not None

            def give_up_after_deadline(exc: BaseException, interval: float) -> None:
                if time.monotonic() + interval >= deadline:
                    raise PublishError(
                        f"could not publish {message.headers.get('task')!r} to "
                        f"{message.exchange or 'the default exchange'!r} on {connection.as_uri()} "
                        f"within {self.timeout:g}s: {exc}"
                    ) from exc
                logger.warning("broker unavailable (%s), publishing again in %.1fs", exc, interval)

            ensured_publish = connection.ensure(
                producer,
                self._publish_once,
                errback=give_up_after_deadline,
                interval_start=0,
                interval_step=1,
                interval_max=1,
            )
            return bool(ensured_publish(producer, message, deadline))

    def _publish_once(self, producer: Producer, message: OutgoingMessage, deadline: float) -> bool:
        returned = self._returns_on(producer.channel)
        remaining = max(0.1, deadline - time.monotonic())
        producer.publish(
            message.body,
            exchange=message.exchange,
            routing_key=message.routing_key,
            headers=message.headers,
            serializer=None if message.content_type else "json",
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            delivery_mode=PERSISTENT,
            mandatory=True,
            message_id=message.message_id,
            correlation_id=message.message_id,
            declare=self.declare,
            timeout=remaining,
            confirm_timeout=remaining,
        )
        if message.message_id in returned:
            returned.discard(message.message_id)
            return False
        return True

    def _returns_on(self, channel: Any) -> set[str]:
        """Ids of messages the broker returned as unroutable on ``channel``.

        RabbitMQ sends ``basic.return`` before the confirm, so by the time a
        confirmed publish comes back the set already holds its id.
        """
        returned = self._returned.get(channel)
        if returned is None:
            returned = self._returned[channel] = set()

            def on_return(exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
                returned.add(message.properties.get("message_id"))

            channel.events["basic_return"].add(on_return)
        return returned
