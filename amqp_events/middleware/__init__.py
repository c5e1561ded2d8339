"""The library's cross-cutting features as middleware (see :class:`amqp_events.core.context.Middleware`).

* :mod:`~amqp_events.middleware.tracing`: OpenTelemetry spans of firing, handling and replaying;
* :mod:`~amqp_events.middleware.metrics`: Prometheus metrics of firing and handling;
* :mod:`~amqp_events.middleware.cloud_events`: CloudEvents read into event messages;
* :mod:`~amqp_events.middleware.inbox`: exactly-once effects (a handler's inbox or dedup store);
* :mod:`~amqp_events.middleware.logs`: structured log lines about events.

Circuit breakers are middleware too (:mod:`amqp_events.breakers.worker`), added by a worker when it starts.
Which a service gets: :mod:`amqp_events.features`.
"""

from __future__ import annotations
