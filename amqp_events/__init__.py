"""celery-amqp-events: reliable domain events for Celery on RabbitMQ.

>>> from amqp_events.celery import events_app
>>> app = events_app("orders", broker_url="amqp://guest:guest@localhost:5672/")
"""

from importlib.metadata import PackageNotFoundError, version

from amqp_events.app import EventsApp, events_app
from amqp_events.breaker import BreakerPolicy
from amqp_events.errors import (
    BadArguments,
    DelayTooLong,
    DuplicateHandler,
    InvalidName,
    PermanentFailure,
    PublishError,
    Rejected,
    RetryRequested,
    SettingsFrozen,
    TopologyMismatch,
    TopologyMissing,
    WorkerLost,
)
from amqp_events.events import Event
from amqp_events.handler import EventHandler, current_event
from amqp_events.health import Health
from amqp_events.message import EventMetadata, Reason
from amqp_events.policy import RetryPolicy
from amqp_events.sections import optional, poisonous, retry

try:
    __version__ = version("celery-amqp-events")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
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
    "PermanentFailure",
    "PublishError",
    "Reason",
    "Rejected",
    "RetryPolicy",
    "RetryRequested",
    "SettingsFrozen",
    "TopologyMismatch",
    "TopologyMissing",
    "WorkerLost",
    "__version__",
    "current_event",
    "events_app",
    "optional",
    "poisonous",
    "retry",
]
