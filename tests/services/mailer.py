"""The ``mailer`` test service: handlers under flow control, each run recorded as it starts and as it ends (the
start after its lease and its place in the window were taken, the end before the lease goes back)."""

import os
import signal
import time

from amqp_events.celery import events_app
from services.behaviour import record

app = events_app(
    "mailer",
    broker_url=os.environ["BROKER_URL"],
    amqp_events_heartbeat_interval=float(os.environ.get("HEARTBEAT_INTERVAL", "5")),
    amqp_events_max_deliveries=int(os.environ.get("MAX_DELIVERIES", "3")),
    amqp_events_limit_keys=int(os.environ.get("LIMIT_KEYS", "256")),
)


def run(handler: str, n: int, sleep: float, kill: bool, **fields: object) -> None:
    record("mailer", tag="start", handler=handler, n=n, **fields)
    if kill:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(sleep)
    record("mailer", tag="end", handler=handler, n=n, **fields)


@app.handler("mail.send", concurrency=int(os.environ.get("CONCURRENCY", "2")))
def send(n: int, sleep: float = 0.0, kill: bool = False) -> None:
    run("send", n, sleep, kill)


@app.handler("mail.per_account", concurrency=1, concurrency_key="account")
def per_account(account: str, n: int, sleep: float = 0.0) -> None:
    run("per_account", n, sleep, False, account=account)


@app.handler(
    "mail.paced",
    rate_limit=os.environ.get("RATE", "10/5s"),
    burst=int(os.environ["BURST"]) if "BURST" in os.environ else None,
)
def paced(n: int, sleep: float = 0.0) -> None:
    record("mailer", tag="start", handler="paced", n=n)
    time.sleep(sleep)


@app.handler("mail.per_key_paced", rate_limit=os.environ.get("KEY_RATE", "60/m"), rate_limit_key="account")
def per_key_paced(account: str, n: int) -> None:
    record("mailer", tag="start", handler="per_key_paced", n=n, account=account)
