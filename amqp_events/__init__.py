"""celery-amqp-events: reliable domain events for Celery on RabbitMQ.

>>> from amqp_events.celery import events_app
>>> app = events_app("orders", broker_url="amqp://guest:guest@localhost:5672/")
"""

from amqp_events.app import DuplicateHandler, EventsApp, TopologyMissing, events_app
from amqp_events.declare import TopologyMismatch
from amqp_events.delays import DelayTooLong
from amqp_events.events import Event
from amqp_events.handler import EventHandler, current_event
from amqp_events.message import EventMetadata, Reason
from amqp_events.publisher import PublishError
from amqp_events.retry import PermanentFailure, RetryPolicy

__version__ = "0.2.0"

__all__ = [
    "DelayTooLong",
    "DuplicateHandler",
    "Event",
    "EventHandler",
    "EventMetadata",
    "EventsApp",
    "PermanentFailure",
    "PublishError",
    "Reason",
    "RetryPolicy",
    "TopologyMismatch",
    "TopologyMissing",
    "current_event",
    "events_app",
]
