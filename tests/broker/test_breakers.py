"""Circuit breakers and health checks on a real broker with real workers (the state machine: test_breaker.py)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import control, queue_state

from amqp_events import EventsApp
from amqp_events.testing import wait_for

CHARGE, NOTE, BOOK = "guarded:guarded.charge", "guarded:guarded.note", "guarded:guarded.book"

pytestmark = pytest.mark.broker


def fire(producer: EventsApp, event: str, numbers: range) -> None:
    with producer.batch():
        for n in numbers:
            producer.fire(event, [n], {})


@pytest.fixture
def flags(tmp_path: Path) -> Path:
    """The directory of the ``guarded`` service's dependency switches."""
    (tmp_path / "flags").mkdir()
    return tmp_path / "flags"


def start(worker: Any, flags: Path, *, breaker: bool = True, coroutines: bool = False, **options: Any) -> Any:
    env = {"FLAGS_DIR": str(flags), "MAX_RETRIES": "5", "BREAKER": "on" if breaker else "off"}
    if coroutines:  # the handlers written async def
        env["COROUTINES"] = "1"
    return worker("guarded", env=env, **options)


def outage(producer: EventsApp, records: Any, flags: Path, events: int, seconds: float) -> dict[str, Any]:
    """``payments-down`` for ``seconds`` while ``events`` charges and as many notes arrive; then until all
    charges succeeded. Returns what was measured."""
    (flags / "payments-down").touch()
    down_at = time.monotonic()
    fire(producer, "guarded.charge", range(events))
    fire(producer, "guarded.note", range(events))
    held = []
    while time.monotonic() - down_at < seconds:
        time.sleep(1)  # a sample a second of the queue during the outage: a measurement, not a wait for an outcome
        held.append(queue_state(producer, CHARGE)[0])
    notes_during = len({run["tag"] for run in records.all() if run["tag"].startswith("note-")})
    (flags / "payments-down").unlink()

    def charged() -> bool:
        return len({run["tag"] for run in records.all(failed=False) if run["tag"].startswith("charge-")}) == events

    wait_for(charged, 120, what="every charge handled after the recovery")
    runs = [run for run in records.all() if run["tag"].startswith("charge-")]
    return {
        "failed_attempts": sum(1 for run in runs if run["failed"]),
        "successes": Counter(run["tag"] for run in runs if not run["failed"]),
        "held": held,
        "notes_during": notes_during,
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_open_breaker_keeps_the_messages_on_the_broker_through_an_outage(
    worker, producer, records, archive_of, flags, capsys
):
    guarded = start(worker, flags)
    with_breaker = outage(producer, records, flags, events=500, seconds=20)
    guarded.stop()
    assert archive_of("guarded").count() == 0
    records.path.write_text("")
    start(worker, flags, breaker=False)
    without = outage(producer, records, flags, events=500, seconds=20)
    with capsys.disabled():
        print(
            f"\n500 events, 20 s outage: {with_breaker['failed_attempts']} failed attempts with a breaker, "
            f"{without['failed_attempts']} without; charges waiting on the broker while open: {with_breaker['held']}"
        )
    assert set(with_breaker["successes"].values()) == {1} and len(with_breaker["successes"]) == 500
    assert with_breaker["notes_during"] == 500  # the service's other handler went on throughout
    assert min(with_breaker["held"][3:]) >= 400  # the queue kept its messages while the breaker was open
    assert with_breaker["failed_attempts"] * 10 < without["failed_attempts"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("coroutines", [False, True], ids=["plain", "async"])
def test_an_unhealthy_check_pauses_the_handlers_requiring_it_and_a_healthy_one_resumes_them(
    coroutines, worker, producer, records, flags, capsys
):
    start(worker, flags, coroutines=coroutines)
    wait_for(lambda: queue_state(producer, BOOK)[1] == 1, 30, what="the worker consuming the book queue")
    (flags / "ledger-down").touch()
    down_at = time.monotonic()
    # Within one check interval (0.5 s), one tick and the broker's cancel; the bound leaves room for a loaded machine
    # and the management API's lag, and the time is printed.
    wait_for(lambda: queue_state(producer, BOOK)[1] == 0, 10, what="the book queue paused")
    paused_after = time.monotonic() - down_at
    fire(producer, "guarded.book", range(20))
    fire(producer, "guarded.note", range(20))
    wait_for(lambda: len(records.all()) >= 20, 30, what="the notes handled")
    assert queue_state(producer, BOOK) == (20, 0) and records.all(tag="book-0") == []
    (flags / "ledger-down").unlink()
    wait_for(lambda: len(records.all()) >= 40, 30, what="the books handled once the ledger is healthy")
    with capsys.disabled():
        print(f"\nhealth check unhealthy -> queue paused in {paused_after:.2f} s (interval 0.5 s)")


@pytest.mark.timeout(120)
def test_an_operator_pauses_and_resumes_a_handler_in_every_worker_of_the_service(worker, producer, records, flags, cli):
    start(worker, flags)
    start(worker, flags, pool="prefork", concurrency=2)
    wait_for(lambda: queue_state(producer, NOTE)[1] == 2, 30, what="both workers consuming")
    opened = cli("breakers", "open", "note", app="services.guarded")
    assert opened.exit_code == 0, opened.output
    assert "open: 2 worker(s)" in opened.output
    assert queue_state(producer, NOTE)[1] == 0
    listed = cli("breakers", "--wait", "3", app="services.guarded")
    assert listed.output.count("breaker  open       services.guarded.note") == 2, listed.output
    fire(producer, "guarded.note", range(10))  # confirmed: in the queue, which nobody consumes
    assert queue_state(producer, NOTE) == (10, 0) and records.all() == []
    closed = cli("breakers", "close", "note", app="services.guarded")
    assert "close: 2 worker(s)" in closed.output, closed.output
    wait_for(lambda: len(records.all()) == 10, 30, what="the notes handled after the resume")


@pytest.mark.timeout(120)
def test_with_prefork_the_children_follow_the_breaker_of_their_main_process(worker, producer, records, flags):
    start(worker, flags, pool="prefork", concurrency=2)
    (flags / "payments-down").touch()
    fire(producer, "guarded.charge", range(100))
    # Waiting on the broker, not burning retries in the children: what they had taken is handed back (sooner or
    # later on a loaded machine), and the retries from before the trip wait on the delay ladder.
    wait_for(lambda: queue_state(producer, CHARGE)[0] >= 80, 30, what="the charges back in their queue")
    tripped = len(records.all(failed=True))
    time.sleep(4)  # two open periods in which nothing but probes may run: no event marks "nothing else ran"
    failed = records.all(failed=True)
    # Once tripped, the children run only the one half-open probe of each 2 s open period. (How many ran before
    # the trip depends on how soon the main process's tick sees the third failure: later on a loaded machine.)
    assert len(failed) - tripped <= 3, (tripped, len(failed))
    assert len({run["pid"] for run in failed}) <= 2
    (flags / "payments-down").unlink()
    wait_for(lambda: len(records.all(failed=False)) == 100, 60, what="every charge handled after the recovery")


@pytest.mark.timeout(120)
def test_a_coroutine_handler_s_failures_open_its_breaker_and_its_events_wait_on_the_broker(
    worker, producer, records, flags
):
    start(worker, flags, coroutines=True)
    (flags / "payments-down").touch()
    fire(producer, "guarded.charge", range(30))
    wait_for(lambda: queue_state(producer, CHARGE)[1] == 0, 30, what="the breaker open: the charge queue paused")
    (flags / "payments-down").unlink()
    wait_for(lambda: len(records.all(failed=False)) >= 30, 90, what="every charge handled once the breaker closed")
    succeeded = Counter(run["tag"] for run in records.all(failed=False))
    assert len(succeeded) == 30 and set(succeeded.values()) == {1}


@pytest.mark.timeout(180)
def test_pausing_a_handler_that_shares_its_queue_holds_its_events_alone_and_loses_none(worker, producer, records, cli):
    accounts = worker("accounts", env={"AMQP_EVENTS_QUEUE_LAYOUT": "per_service", "PAUSED_WAIT": "1"})
    opened = cli("breakers", "open", "audit", app="services.accounts")
    assert "open: 1 worker(s)" in opened.output, opened.output
    ids = [producer.fire("test.ping", [f"held-{n}"], {}) for n in range(5)]
    wait_for(lambda: len(records.all(service="accounts")) == 5, 30, what="the other handler running meanwhile")
    # Each of the paused handler's events went round the delay ladder at least twice, and never ran.
    handed_back = lambda: accounts.log().count("handed back, breaker open")  # noqa: E731
    wait_for(lambda: handed_back() >= 10, 30, what="the paused handler's events waiting on the broker")
    assert records.all(service="accounts.audit") == []
    closed = cli("breakers", "close", "audit", app="services.accounts")
    assert "close: 1 worker(s)" in closed.output, closed.output
    wait_for(lambda: len(records.all(service="accounts.audit")) == 5, 30, what="its events run after the resume")
    assert sorted(run["id"] for run in records.all(service="accounts.audit")) == sorted(ids)
    assert {run["attempt"] for run in records.all()} == {1}  # a wait while paused is not an attempt
    assert producer.archive("accounts").count() == 0


@pytest.mark.timeout(120)
def test_remote_control_and_breakers_agree_a_cancelled_queue_stays_cancelled_and_an_open_breaker_holds_an_added_one(
    worker, producer, records, flags, cli, broker_url
):
    start(worker, flags)
    wait_for(lambda: queue_state(producer, NOTE)[1] == 1, 30, what="the worker consuming")
    assert "no longer consuming" in control(broker_url, "cancel_consumer", NOTE, app="services.guarded")
    assert queue_state(producer, NOTE)[1] == 0
    # The breaker closing again does not undo what the operator cancelled ...
    assert "open: 1 worker(s)" in cli("breakers", "open", "note", app="services.guarded").output
    assert "close: 1 worker(s)" in cli("breakers", "close", "note", app="services.guarded").output
    fire(producer, "guarded.note", range(3))
    assert queue_state(producer, NOTE) == (3, 0)
    # ... and an operator adding the queue back while its breaker is open does not override the breaker.
    assert "open: 1 worker(s)" in cli("breakers", "open", "note", app="services.guarded").output
    assert "add consumer" in control(broker_url, "add_consumer", NOTE, app="services.guarded")
    assert queue_state(producer, NOTE) == (3, 0)
    assert "close: 1 worker(s)" in cli("breakers", "close", "note", app="services.guarded").output
    wait_for(lambda: len(records.all()) == 3, 30, what="the notes handled once the breaker closed")
