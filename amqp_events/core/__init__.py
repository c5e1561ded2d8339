"""The core: firing and handling events for one service, knowing nothing of Celery.

Everything here works from a :class:`~amqp_events.core.context.ServiceContext`
(a service's name, settings, handlers, transport, clock and middleware):

* :mod:`~amqp_events.core.context`: the context, and the middleware hooks around firing and handling;
* :mod:`~amqp_events.core.firing`: firing an event, batches, and the sinks that take fired events;
* :mod:`~amqp_events.core.events`: what ``@app.event`` makes of a function or a class;
* :mod:`~amqp_events.core.handling`: the handling pipeline every message a worker takes goes through;
* :mod:`~amqp_events.core.outcome`: what becomes of a message (pure), by the rules of
  :mod:`~amqp_events.core.policy` and the sections of :mod:`~amqp_events.core.sections`;
* :mod:`~amqp_events.core.publishing`: carrying an outcome out;
* :mod:`~amqp_events.core.handler`, :mod:`~amqp_events.core.delivery`: a handler and a message, as the core sees them.

What the core asks of a broker is :class:`amqp_events.transport.base.Transport`.
"""
