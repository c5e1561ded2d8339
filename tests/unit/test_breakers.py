"""The circuit breaker's state machine (pure; the worker side is in test_breakers.py)."""

from __future__ import annotations

import logging

import pytest

from amqp_events.breakers.breaker import Breaker, BreakerPolicy, State
from amqp_events.breakers.worker import WorkerBreakers
from amqp_events.core.handler import Handler
from amqp_events.testing import wait_for

#: Trips on the first failure, half-open 50 ms later.
FAST_TRIP = {"failures": 1, "open_for": 0.05, "open_max": 0.05}


def test_three_failures_within_the_window_trip_it_and_successes_do_not():
    breaker = Breaker(BreakerPolicy(failures=3, window=60, open_for=30))
    assert breaker.record(True, 0) is None and breaker.record(False, 1) is None
    assert breaker.record(True, 61) is None  # the first failure left the window
    assert breaker.record(True, 62) is None
    opened = breaker.record(True, 63)
    assert opened is not None and (opened.state, opened.open_for) == (State.OPEN, 30)
    assert breaker.record(True, 64) is None  # open: outcomes of runs already going say nothing new


def test_it_turns_half_open_after_the_period_and_the_probe_decides():
    breaker = Breaker(BreakerPolicy(failures=1, open_for=30))
    breaker.record(True, 0)
    assert breaker.poll(29) is None
    assert breaker.poll(30).state == State.HALF_OPEN  # type: ignore[union-attr]
    reopened = breaker.record(True, 31)
    assert reopened is not None and reopened.state == State.OPEN
    breaker.poll(61)
    assert breaker.record(False, 62).state == State.CLOSED  # type: ignore[union-attr]


@pytest.mark.parametrize(("growth", "periods"), [("fixed", [30, 30, 30]), ("linear", [30, 60, 90]),
                                                 ("exponential", [30, 60, 100])])  # fmt: skip
def test_the_open_period_grows_with_consecutive_trips_up_to_its_cap(growth, periods):
    breaker = Breaker(BreakerPolicy(failures=1, open_for=30, growth=growth, open_max=100))
    seen, now = [], 0.0
    for _ in periods:
        seen.append(breaker.record(True, now).open_for)  # type: ignore[union-attr]
        now += 1000
        breaker.poll(now)
    assert seen == periods


def test_a_failure_ratio_needs_enough_runs():
    breaker = Breaker(BreakerPolicy(ratio=0.5, min_messages=4, window=60))
    assert [breaker.record(failed, t) for t, failed in enumerate([True, True, False])] == [None, None, None]
    assert breaker.record(False, 3) is None  # 2 of 4: 50 %, but the last run succeeded
    assert breaker.record(True, 4).state == State.OPEN  # type: ignore[union-attr]  # 3 of 5


def test_the_trip_log_turns_into_an_error_after_three_trips_in_five_minutes_and_calms_down():
    breaker = Breaker(BreakerPolicy(failures=1, open_for=30))
    levels = []
    for now in (0, 100, 200, 300, 2200):
        levels.append(breaker.record(True, now).level)  # type: ignore[union-attr]
        breaker.poll(now + 50)
        breaker.record(False, now + 51)
    assert levels == [logging.WARNING, logging.WARNING, logging.ERROR, logging.ERROR, logging.WARNING]


def test_a_hold_keeps_it_open_until_every_reason_is_released():
    breaker = Breaker(BreakerPolicy())
    assert breaker.hold("operator").state == State.OPEN  # type: ignore[union-attr]
    assert breaker.hold("health check ledger unhealthy") is None
    assert breaker.poll(10**6) is None
    assert breaker.release("operator", 5) is None
    assert breaker.release("health check ledger unhealthy", 6).state == State.HALF_OPEN  # type: ignore[union-attr]


@pytest.mark.parametrize("value", [{"failures": 0}, {"ratio": 1.5}, {"growth": "cubic"}, {"open_max": 1}])
def test_a_bad_policy_is_refused(value):
    with pytest.raises(ValueError):
        BreakerPolicy.of(value, None)


def test_a_handlers_option_is_read_over_the_apps_default():
    default = BreakerPolicy(failures=5)
    assert BreakerPolicy.of(None, default) is default and BreakerPolicy.of(None, None) is None
    assert BreakerPolicy.of(False, default) is None and BreakerPolicy.of(True, None) == BreakerPolicy()
    assert BreakerPolicy.of({"open_for": 60}, default) == BreakerPolicy(failures=5, open_for=60)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"breaker": {"failurs": 3}}, "failurs"),
        ({"breaker": "yes"}, "breaker= takes"),
        ({"requires": "payments-api"}, "requires= takes"),
    ],
)
def test_a_handler_s_breaker_options_are_checked_where_they_are_written(options, said):
    from amqp_events import events_app

    app = events_app("payments", broker_url="memory://")
    with pytest.raises(TypeError, match=said):

        @app.handler("billing.invoice.paid", **options)
        def paid(invoice_id: int): ...

    app.close()


def test_the_queues_a_worker_holds_are_those_it_will_start_again_itself_not_a_half_open_one_backing_off():
    note = Handler("guarded.note", "guarded.note", "guarded:guarded.note", print, options={"breaker": FAST_TRIP})
    book = Handler("guarded.book", "guarded.book", "guarded:guarded.book", print)
    breakers = WorkerBreakers("guarded", [note, book], None, {})
    paused: list[str] = []
    breakers.start(pause=paused.append, resume=lambda queue: paused.remove(queue))
    breakers.report(note.task_name, failed=True)
    breakers.tick()
    assert breakers.held_queues() == {note.queue} == set(paused)  # open
    wait_for(lambda: breakers.tick() or breakers.breakers[note.task_name].state == State.HALF_OPEN, 5)
    assert paused == [] and breakers.held_queues() == set()  # consumed again, for its probe
    breakers.back_off(note.task_name, 60)  # its probe was over a limit: flow control does not stop a probe
    breakers.back_off(book.task_name, 60)  # a closed breaker's queue is left while flow control backs it off
    breakers.tick()
    assert breakers.held_queues() == {book.queue} == set(paused)
    assert breakers.open_queues() == {note.queue, book.queue}  # what a consuming pool's processes stay off
