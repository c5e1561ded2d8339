"""The documented entry point: ``from amqp_events.celery import events_app``."""

from amqp_events.app import EventsApp, events_app

__all__ = ["EventsApp", "events_app"]
