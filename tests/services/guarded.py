"""The ``guarded`` test service: a handler behind a circuit breaker, one behind a health check, one without.

Its dependencies are files in ``$FLAGS_DIR``: ``payments-down`` makes ``charge`` fail, ``ledger-down``
makes the ``ledger`` health check unhealthy.
"""

import os
from pathlib import Path

from amqp_events import Health
from amqp_events.celery import events_app
from services.behaviour import maybe_coroutine, record

FLAGS = Path(os.environ.get("FLAGS_DIR", "."))

app = events_app(
    "guarded",
    broker_url=os.environ["BROKER_URL"],
    amqp_events_max_retries=int(os.environ.get("MAX_RETRIES", "3")),
    amqp_events_heartbeat_interval=1.0,
    amqp_events_breaker=(
        {"failures": 3, "window": 10, "open_for": 2.0} if os.environ.get("BREAKER", "on") == "on" else None
    ),
)


@app.health_check("ledger", interval=0.5)
def ledger() -> Health:
    return Health.UNHEALTHY if (FLAGS / "ledger-down").exists() else Health.HEALTHY


@app.handler("guarded.charge")
@maybe_coroutine
def charge(n: int) -> None:
    down = (FLAGS / "payments-down").exists()
    record("guarded", tag=f"charge-{n}", failed=down)
    if down:
        raise ConnectionError("payments down")


@app.handler("guarded.note", breaker=False)
@maybe_coroutine
def note(n: int) -> None:
    record("guarded", tag=f"note-{n}")


@app.handler("guarded.book", requires=["ledger"], breaker=False)
@maybe_coroutine
def book(n: int) -> None:
    record("guarded", tag=f"book-{n}")
