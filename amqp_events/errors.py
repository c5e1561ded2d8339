"""Every exception the library raises on purpose, in one place.

Everything a user catches or raises derives from :class:`AmqpEventsError` (and, where it says so, from a
built-in exception as before: ``PublishError`` is a ``RuntimeError`` too). The last group are not raised to
anyone: they describe why a message was retried or archived (the archive's exception type).
"""

from __future__ import annotations

from typing import Any


class AmqpEventsError(Exception):
    """The base of the library's exceptions: ``except AmqpEventsError`` catches any of them."""


class PermanentFailure(AmqpEventsError):
    """Raise from a handler to archive its message at once (reason ``non_retryable``)."""


class PublishError(AmqpEventsError, RuntimeError):
    """The broker could not be reached, or did not confirm a message, in time.

    ``event_ids`` names the events that may or may not have reached the
    broker: fire such an event again with ``app.fire(..., event_id=...)`` so
    that a copy that did arrive is the same event (an inbox skips it).
    """

    def __init__(self, text: str, event_ids: tuple[str, ...] | list[str] = ()) -> None:
        super().__init__(text)
        self.event_ids = tuple(event_ids)


class PublishRefused(PublishError):
    """The broker refused (nacked) the message each time it was published, until the publish timeout: a queue it
    was routed to is over its bound (a delay ladder's level, say)."""


class MessageRefused(PublishError):
    """The broker closed the channel over a message it would not take; ``permanent``: it never will as it is
    (larger than the broker's ``max_message_size``, say)."""

    def __init__(self, text: str, permanent: bool) -> None:
        super().__init__(text)
        self.permanent = permanent


class TopologyMissing(AmqpEventsError, RuntimeError):
    """A queue or exchange the library needs is not on the broker."""


class TopologyMismatch(AmqpEventsError, RuntimeError):
    """An exchange or queue exists on the broker with other arguments than this service declares."""

    def __init__(self, text: str, kind: str = "", name: str = "", argument: str = "") -> None:
        super().__init__(text)
        self.kind, self.name, self.argument = kind, name, argument


class PermissionRefused(AmqpEventsError, RuntimeError):
    """The broker refused the service's user something it needs (a grant is missing); the message names it."""


class InvalidName(AmqpEventsError, ValueError):
    """A service or event name the topology cannot be built from."""


class DuplicateHandler(AmqpEventsError, RuntimeError, ValueError):
    """A service registered a second handler for the same event (a ``RuntimeError``, as in 0.1.0)."""


class DelayTooLong(AmqpEventsError, ValueError):
    """A delay beyond what the broker's delay ladder can hold."""


class SettingsFrozen(AmqpEventsError, RuntimeError):
    """An ``amqp_events_*`` setting was changed after the app had read its settings."""


class BadArguments(AmqpEventsError, TypeError):
    """The event's arguments do not fit the handler's signature (or do not build its typed event)."""


class TooLarge(AmqpEventsError, ValueError):
    """A message body larger than a worker reads (``amqp_events_max_body_bytes``, decompressed), or headers larger
    than a copy of it could carry."""


class NotOwner(AmqpEventsError, ValueError):
    """Event ownership is on and an event was fired (or about to be) by a service that does not own it."""


class Refused(AmqpEventsError):
    """A worker cannot run a message at all (a CloudEvent it cannot read, a body that is not an event...).

    ``reason`` is the :class:`~amqp_events.Reason` it is archived with, as it arrived.
    """

    def __init__(self, reason: Any, text: str) -> None:
        super().__init__(text)
        self.reason = reason


class ManagementError(AmqpEventsError, RuntimeError):
    """RabbitMQ's management API answered with an error or could not be reached."""


class RelayConflict(AmqpEventsError, RuntimeError):
    """Another relay already relays this SQLite outbox (one at a time)."""


class LocalServerError(AmqpEventsError, RuntimeError):
    """A private development server (RabbitMQ node, PostgreSQL, Redis) could not be started, reached or stopped."""


class WorkerStartError(AmqpEventsError, RuntimeError):
    """A ``celery worker`` started by the testing helpers exited or did not become ready in time."""


class NotModelled(AmqpEventsError):
    """The test relies on something the in-process mode does not model: test it against a real broker."""


class UnhandledEvent(AmqpEventsError, AssertionError):
    """An event was fired that no service in the test handles (``in_process(..., unhandled="ignore")`` allows it)."""


class UnknownService(AmqpEventsError, LookupError):
    """No service of that name on the vhost (none has a queue ``<service>.archive``)."""


class AlreadySettled(AmqpEventsError, RuntimeError):
    """A message was answered twice (ack, requeue, reject): the broker takes one answer per delivery, so a second
    is a defect of the code that gave it (kombu's ``MessageStateError``)."""


class SteeringError(AmqpEventsError, RuntimeError):
    """A worker answered that it could not pause or resume a handler (the message says which and why)."""


# -- why a message was retried or archived (the archive's exception types), never raised to a caller -----


class WorkerLost(Exception):
    """The process running the handler died (SIGKILL, OOM, a crash) before the message was acked."""


class Rejected(Exception):
    """The message came back dead-lettered as rejected (``basic.reject`` without requeue)."""


class RetryRequested(Exception):
    """The handler called ``self.retry()`` without an exception."""


class BreakerOpen(Exception):
    """A prefetched message was handed back unrun: its handler's circuit breaker is open."""


class OverLimit(Exception):
    """An event over its handler's flow-control limit waits on the broker, unrun and uncounted: ``seconds`` is
    about when it may run; ``keyed``: only its key is over (the handler's other events go on)."""

    def __init__(self, message: str, seconds: float, keyed: bool) -> None:
        super().__init__(message, seconds, keyed)  # all three in args: it pickles (a prefork child's outcome)
        self.seconds, self.keyed = seconds, keyed

    def __str__(self) -> str:
        return str(self.args[0])


class LimitUnavailable(AmqpEventsError):
    """A flow-control count cannot be reached now (the node holding a rate limit's window is down, or on the far side
    of a partition): the start is not counted, so the event waits as one over its limit does."""


class ProcessStopping(Exception):
    """A message taken while its pool process stops (recycled, or a warm shutdown) was handed back unrun."""


class Expired(Exception):
    """A message arrived after its ``expires`` time: it is archived unrun."""


class Postponed(Exception):
    """A message arrived before its ``eta``: it waits the rest on the broker."""


class Revoked(Exception):
    """Celery's remote control revoked the event's id (``celery control revoke``; ``--terminate`` ended its run)."""


class Archived(Exception):
    """What Celery's request path reports for an event the library archived (its task-failed event, Flower's
    FAILURE): the reason and what the handler raised. The message itself is settled: its copy is in the archive."""
