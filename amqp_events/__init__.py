"""celery-amqp-events: reliable domain events for Celery on RabbitMQ.

>>> from amqp_events.celery import events_app
>>> app = events_app("orders", broker_url="amqp://guest:guest@localhost:5672/")

The package reads as its architecture (docs/development.md, "Project layout"): the core knows nothing of Celery
(:mod:`amqp_events.core`), cross-cutting features are middleware (:mod:`amqp_events.middleware`), and
everything Celery is in one adapter (:mod:`amqp_events.celery`).
"""

from amqp_events.breakers import BreakerPolicy, Health
from amqp_events.celery import EventsApp, events_app
from amqp_events.celery.app import VERSION as __version__
from amqp_events.celery.task import EventHandler
from amqp_events.core.context import Middleware
from amqp_events.core.delivery import current_event
from amqp_events.core.events import Event
from amqp_events.core.policy import RetryPolicy
from amqp_events.core.sections import optional, poisonous, retry
from amqp_events.errors import (
    AmqpEventsError,
    BadArguments,
    DelayTooLong,
    DuplicateHandler,
    InvalidName,
    MessageRefused,
    NotOwner,
    PermanentFailure,
    PermissionRefused,
    PublishError,
    PublishRefused,
    Refused,
    SettingsFrozen,
    TooLarge,
    TopologyMismatch,
    TopologyMissing,
)
from amqp_events.wire.message import EventMetadata, Reason

__all__ = [
    "AmqpEventsError",
    "BadArguments",
    "BreakerPolicy",
    "DelayTooLong",
    "DuplicateHandler",
    "Event",
    "EventHandler",
    "EventMetadata",
    "EventsApp",
    "Health",
    "InvalidName",
    "MessageRefused",
    "Middleware",
    "NotOwner",
    "PermanentFailure",
    "PermissionRefused",
    "PublishError",
    "PublishRefused",
    "Reason",
    "Refused",
    "RetryPolicy",
    "SettingsFrozen",
    "TooLarge",
    "TopologyMismatch",
    "TopologyMissing",
    "__version__",
    "current_event",
    "events_app",
    "optional",
    "poisonous",
    "retry",
]
