"""Health checks: functions a worker runs on an interval to learn whether a dependency is up.

::

    @app.health_check("payments-api", interval=10)
    def payments_api() -> Health:
        return Health.HEALTHY if ping_payments() else Health.UNHEALTHY

    @app.handler("billing.invoice.paid", requires=["payments-api"])
    def capture(invoice_id: int, amount: str): ...

While a check is unhealthy the breakers of the handlers that require it are
held open (:mod:`amqp_events.breakers`): their messages wait on the broker.
A check runs in its own thread with a timeout (never in the worker's event
loop); one that raises, times out or returns something else counts as
unhealthy and is logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

logger = logging.getLogger(__name__)


class Health(str, Enum):
    """What a health check says; the values of the ``amqp_events_health_check_state`` gauge are 0, 1, 2."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"

    @property
    def gauge(self) -> int:
        return list(Health).index(self)

    def __str__(self) -> str:
        return self.value


@dataclass
class HealthCheck:
    """A registered check: ``function()`` returns a :class:`Health` (or a bool: healthy or not)."""

    name: str
    function: Callable[[], Health | bool]
    #: Seconds between two runs.
    interval: float = 10.0
    #: Seconds a run may take before it counts as unhealthy (default: the interval).
    timeout: float | None = None
    state: Health = Health.HEALTHY
    last_run: float = field(default=0.0)

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ValueError(f"health check {self.name!r}: interval must be > 0")

    def run(self) -> Health:
        """Run it once (in a thread, bounded by the timeout); a failure to answer is unhealthy."""
        answer: list[Health | bool] = []
        failure: list[BaseException] = []

        def call() -> None:
            try:
                answer.append(self.function())
            except Exception as exc:
                failure.append(exc)

        thread = threading.Thread(target=call, daemon=True, name=f"health-check-{self.name}")
        thread.start()
        thread.join(self.timeout or self.interval)
        if thread.is_alive():
            waited = self.timeout or self.interval
            logger.warning("health check %s did not answer within %gs: unhealthy", self.name, waited)
            return Health.UNHEALTHY
        if failure:
            logger.warning("health check %s raised %r: unhealthy", self.name, failure[0])
            return Health.UNHEALTHY
        result = answer[0]
        if isinstance(result, Health):
            return result
        if isinstance(result, bool):
            return Health.HEALTHY if result else Health.UNHEALTHY
        logger.warning("health check %s returned %r, not a Health: unhealthy", self.name, result)
        return Health.UNHEALTHY


class HealthRunner(threading.Thread):
    """Runs every check on its interval in one background thread of the worker's main process.

    It only records each check's state; the worker's event loop reads them
    (:meth:`amqp_events.breakers.worker.WorkerBreakers.tick`).
    """

    def __init__(self, checks: list[HealthCheck]) -> None:
        super().__init__(daemon=True, name="amqp-events-health-checks")
        self.checks = checks
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            now = time.monotonic()
            for check in self.checks:
                if now - check.last_run >= check.interval or not check.last_run:
                    check.last_run = now
                    state = check.run()
                    if state != check.state:
                        level = logging.INFO if state == Health.HEALTHY else logging.WARNING
                        logger.log(level, "health check %s: %s -> %s", check.name, check.state, state)
                    check.state = state
            self.halt.wait(min((check.interval for check in self.checks), default=1.0) / 4)

    def stop(self) -> None:
        self.halt.set()
