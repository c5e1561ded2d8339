"""The ``ledger`` test service: ordered handlers of two events of one aggregate, an account (coroutine handlers
doing the same with ``COROUTINES=1``)."""

import os
import time

from amqp_events import PermanentFailure, current_event
from amqp_events.celery import events_app
from services.behaviour import Flaky, maybe_coroutine, record

app = events_app(
    "ledger",
    broker_url=os.environ["BROKER_URL"],
    amqp_events_max_retries=int(os.environ.get("MAX_RETRIES", "3")),
    amqp_events_backoff_base=1.0,
    amqp_events_partitions=int(os.environ.get("PARTITIONS", "4")),
    amqp_events_history=os.environ.get("HISTORY") == "1",
)


def in_order(account: str, seq: int, how: dict | None) -> None:
    """Record this run (``ok`` or not), sleeping and failing as ``how`` says (``permanent``: until ``FIXED``)."""
    how = {} if os.environ.get("FIXED") else how or {}
    if how.get("announce"):
        record("ledger", tag=f"{account}:{seq}", state="started")
    time.sleep(how.get("sleep", 0))
    failing = how.get("permanent") or current_event().attempt <= how.get("fail_times", 0)
    record("ledger", tag=f"{account}:{seq}", account=account, seq=seq, ok=not failing)
    if how.get("permanent"):
        raise PermanentFailure(f"{account}:{seq} can never succeed")
    if failing:
        raise Flaky(f"{account}:{seq} failed on attempt {current_event().attempt}")


@app.handler("accounts.account.opened", ordered_by="account")
@maybe_coroutine
def on_opened(account: str, seq: int, how: dict | None = None):
    in_order(account, seq, how)


@app.handler("accounts.money.moved", ordered_by="account")
@maybe_coroutine
def on_moved(account: str, seq: int, how: dict | None = None):
    in_order(account, seq, how)


@app.handler("accounts.note.added", ordered_by="account", on_archive="skip")
@maybe_coroutine
def on_note(account: str, seq: int, how: dict | None = None):
    in_order(account, seq, how)
