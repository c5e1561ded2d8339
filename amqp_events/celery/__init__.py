"""The Celery adapter: everything that subclasses, overrides or reads Celery's internals.

The documented entry point is ``from amqp_events.celery import events_app``.

* :mod:`~amqp_events.celery.app`: :func:`events_app` and :class:`EventsApp` (decorators, firing, the context);
* :mod:`~amqp_events.celery.handlers`: ``@app.handler`` and ``@app.event``;
* :mod:`~amqp_events.celery.task`: the handler task, in Celery's terms;
* :mod:`~amqp_events.celery.conf`: the Celery app class: settings read once, the worker's default name;
* :mod:`~amqp_events.celery.queues`: the queues a worker consumes;
* :mod:`~amqp_events.celery.consumer`, :mod:`~amqp_events.celery.loop`: the worker's consumer, its event loop;
* :mod:`~amqp_events.celery.host`: what the worker's pool can do; :mod:`~amqp_events.celery.running`: Celery as
  the host of the dispatcher (:mod:`amqp_events.dispatch`), which carries out each message the consumer takes;
* :mod:`~amqp_events.celery.request`: lost pool processes, counted exactly;
* :mod:`~amqp_events.celery.steps`, :mod:`~amqp_events.celery.control`: worker steps and remote control;
* :mod:`~amqp_events.celery.outbox`: an app's outbox; :mod:`~amqp_events.celery.signals`: ``outcome_settled``;
* :mod:`~amqp_events.celery.inline`: one message run in the caller's thread (the in-process mode).

Each module names the upstream behaviour it adjusts, the versions it was checked on and the test that
fails if an upgrade moves it.
"""

from amqp_events.celery.app import EventsApp, events_app

__all__ = ["EventsApp", "events_app"]
