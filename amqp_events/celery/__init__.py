"""The Celery adapter: everything that subclasses, overrides or reads Celery's internals.

The documented entry point is ``from amqp_events.celery import events_app``.

* :mod:`~amqp_events.celery.app`: :func:`events_app` and :class:`EventsApp` (decorators, firing, the context);
* :mod:`~amqp_events.celery.handlers`: ``@app.handler`` and ``@app.event``;
* :mod:`~amqp_events.celery.task`: the handler task, in Celery's terms;
* :mod:`~amqp_events.celery.conf`: the Celery app class: settings read once, the worker's default name;
* :mod:`~amqp_events.celery.queues`: the queues a worker consumes;
* :mod:`~amqp_events.celery.consumer`, :mod:`~amqp_events.celery.dispatch`, :mod:`~amqp_events.celery.loop`:
  the worker's consumer, the one way each message it takes is carried out, its event loop;
* :mod:`~amqp_events.celery.settling`: ack, requeue, reject, and the copies published first (the archive);
* :mod:`~amqp_events.celery.request`: lost pool processes, counted exactly;
* :mod:`~amqp_events.celery.steps`, :mod:`~amqp_events.celery.control`: worker steps and remote control;
* :mod:`~amqp_events.celery.outbox`: an app's outbox; :mod:`~amqp_events.celery.signals`: ``outcome_settled``;
* :mod:`~amqp_events.celery.inline`: one message run in the caller's thread (the in-process mode).

Each module names the upstream behaviour it adjusts, the versions it was checked on and the test that
fails if an upgrade moves it.
"""

from amqp_events.celery.app import EventsApp, events_app

__all__ = ["EventsApp", "events_app"]
