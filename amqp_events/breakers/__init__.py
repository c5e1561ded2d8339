"""Circuit breakers and health checks: pause consuming a failing handler's queue, resume after a cool-down.

* :mod:`~amqp_events.breakers.breaker`: a breaker's state machine and its policy (pure);
* :mod:`~amqp_events.breakers.health`: health checks, run on their intervals in a thread of the worker;
* :mod:`~amqp_events.breakers.worker`: a worker's breakers (shared with its pool), and their middleware.

The worker steps and the remote-control command that drive them are the Celery adapter's
(:mod:`amqp_events.celery.steps`, :mod:`amqp_events.celery.control`).
"""

from amqp_events.breakers.breaker import BreakerPolicy
from amqp_events.breakers.health import Health, HealthCheck

__all__ = ["BreakerPolicy", "Health", "HealthCheck"]
