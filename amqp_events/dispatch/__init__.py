"""Carrying out what becomes of each message a worker takes, whatever host runs it: the dispatcher (routed once,
then archived, run or handed to the host's own path), the host it is given (:mod:`~amqp_events.dispatch.runtime`),
how its answer reaches the broker (:mod:`~amqp_events.dispatch.settling`) and a replay's batches
(:mod:`~amqp_events.dispatch.batches`). Nothing here knows Celery."""
