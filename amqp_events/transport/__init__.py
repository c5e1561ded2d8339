"""Transports: what the core asks of a broker, and the brokers that answer it, side by side.

* :mod:`~amqp_events.transport.base`: the :class:`~amqp_events.transport.base.Transport` protocol and the
  shapes it trades in (stored messages, browsing, stream readings);
* :mod:`~amqp_events.transport.rabbitmq`: the transport on RabbitMQ, through kombu and py-amqp, with
  :mod:`~amqp_events.transport.publisher` (confirmed publishing, one message or a pipelined batch) and
  :mod:`~amqp_events.transport.streams` (reading the history stream);
* :mod:`~amqp_events.transport.memory`: a broker in memory with RabbitMQ's routing, TTLs, dead-lettering and
  length limits, which the in-process mode (:mod:`amqp_events.testing.in_process`) stands in with.

Nothing here knows Celery: the RabbitMQ transport takes its connections from anything with Celery's
``connection_for_write()`` (an app).
"""
