"""Flow control's pure parts: the windows that pace a rate, a key's one canonical form and its bucket, what a
worker process holds while it waits, and the prefetch of a limited handler's queue."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_events import events_app
from amqp_events.errors import BadArguments
from amqp_events.limits import Rate
from amqp_events.limits.options import limit_key
from amqp_events.limits.rates import allowances
from amqp_events.limits.waiting import (
    HELD_PER_HANDLER,
    LONGEST_HOLD,
    Waiting,
    keyed_limit,
    limited_prefetch,
)
from amqp_events.topology.limits import bucket_of, limit_prefix, start_slack_ms

WINDOWS = st.sampled_from([1, 2, 10, 60, 120, 3600, 86_400])


def test_a_rate_starts_evenly_by_default_a_second_s_worth_at_most_at_once():
    [per_minute] = allowances((Rate(50, 60),))
    assert (per_minute.count, per_minute.millis, per_minute.paced) == (1, 1200, True)  # one in any 1.2 s
    [busy] = allowances((Rate(600, 60),))
    assert (busy.count, busy.millis) == (10, 1000)  # ten in any second
    [per_second] = allowances((Rate(100, 1),))
    assert (per_second.count, per_second.millis, per_second.paced) == (100, 1000, False)  # a second: as written
    [whole] = allowances((Rate(50, 60),), burst=50)
    assert (whole.count, whole.millis, whole.paced) == (50, 60_000, False)  # the window's allowance at once
    paced, day = allowances((Rate(10, 1), Rate(100_000, 86_400)))
    assert not paced.paced and (day.count, day.millis) == (100_000, 86_400_000)  # the longer one caps


@given(st.integers(1, 100_000), WINDOWS, st.integers(1, 200))
def test_a_paced_window_never_lets_more_start_in_the_rate_s_window_than_it_allows(count, seconds, burst):
    window, *cap = allowances((Rate(count, seconds),), burst)
    assert window.count <= count and window.millis <= seconds * 1000
    assert window.count >= min(count, max(1, math.ceil(count / seconds)) // 2)  # a second's worth, or about half
    if not window.paced:
        assert (window.count, window.millis) == (count, seconds * 1000) and not cap
    elif cap:  # no divisor of the count came near a second's worth: the rate as written caps the pace
        assert [(each.count, each.millis, each.paced) for each in cap] == [(count, seconds * 1000, False)]
    else:  # a start counted for its window and its slacks: any span of the rate's window holds at most its count
        lasts = window.millis + 2 * start_slack_ms(window.millis, window.paced, window.count)
        assert math.ceil(seconds * 1000 / lasts) * window.count <= count


def test_a_key_has_one_canonical_form_and_what_has_none_is_refused():
    assert limit_key(42) == limit_key("42") == "42"
    for value in (42.0, [42], None, True, "", "x" * 256, {"id": 42}):
        with pytest.raises(BadArguments, match="a limit's key"):
            limit_key(value)


@given(st.one_of(st.integers(), st.text(min_size=1, max_size=255)), st.integers(1, 4096))
def test_every_key_falls_in_one_of_the_buckets_the_same_in_every_process(key, buckets):
    canonical = limit_key(key)
    bucket = bucket_of(canonical, buckets)
    assert 0 <= bucket < buckets and bucket == bucket_of(limit_key(key), buckets)
    assert limit_prefix("mailer", "mail.send", canonical, buckets) == f"mailer.limit.mail.send.key.{bucket}"


def test_ten_thousand_keys_make_at_most_as_many_windows_as_the_buckets():
    names = {limit_prefix("mailer", "mail.send", limit_key(n), 256) for n in range(10_000)}
    assert len(names) == 256


def test_events_of_one_line_take_their_turns_in_the_order_they_came_and_other_lines_go_on():
    waiting = Waiting()
    assert [waiting.arrive("send", "", event, now=0.0) for event in ("a", "b", "c")] == [True, False, False]
    for event in ("a", "b", "c"):
        waiting.hold("send", "", event, now=0.0, seconds=1.0)
    assert waiting.arrive("send", "", "a", 0.1) and not waiting.arrive("send", "", "b", 0.1)
    assert waiting.arrive("send", "7", "x", 0.1)  # another key's line
    waiting.leave("send", "a")
    assert waiting.arrive("send", "", "b", 0.2) and not waiting.arrive("send", "", "c", 0.2)
    # One behind asks a moment after the first, which may have started by then.
    waiting.hold("send", "", "b", now=0.5, seconds=1.0)
    assert waiting.hold("send", "", "c", now=0.5, seconds=1.0) == pytest.approx(1.002)


def test_a_process_holds_a_bounded_number_of_events_each_for_a_bounded_time():
    waiting = Waiting()
    for n in range(HELD_PER_HANDLER):
        waiting.arrive("send", str(n), f"e{n}", now=0.0)
        assert waiting.may_hold("send", str(n), f"e{n}", now=0.0)
        waiting.hold("send", str(n), f"e{n}", now=0.0, seconds=1.0)
    assert not waiting.may_hold("send", "new", "e-new", now=0.0)  # past the bound: the ladder
    assert waiting.may_hold("other", "", "o", now=0.0)  # another handler has its own room
    assert waiting.may_hold("send", "0", "e0", now=LONGEST_HOLD - 1)
    assert not waiting.may_hold("send", "0", "e0", now=LONGEST_HOLD)  # held too long: the ladder


def test_an_event_asks_again_when_its_process_s_own_start_expires_else_often_enough():
    waiting = Waiting()
    waiting.started("w", lasts=1.02, now=10.0)
    assert waiting.until_free("w", spacing=1.0, now=10.5) == pytest.approx(0.521)
    assert waiting.until_free("w", spacing=1.0, now=11.5) == pytest.approx(0.1)  # another's start: a tenth
    assert waiting.until_free("w", spacing=86_400, now=11.5) == 60  # and at least every minute
    assert waiting.until_free("w", spacing=0.01, now=11.5) == 0.01


def test_a_limited_handler_s_queue_gives_a_process_the_runs_it_makes_and_for_keys_the_held_ones_besides():
    assert limited_prefetch(None, 4) is None
    assert limited_prefetch(False, 1) == 1 and limited_prefetch(False, 8) == 8
    assert limited_prefetch(True, 1) == 1 + HELD_PER_HANDLER
    app = events_app("mailer", broker_url="amqp://mailer:secret@in-process.invalid//")

    @app.handler("mail.requested", rate_limit="50/m")
    def send(n: int) -> None: ...

    @app.handler("account.closed", concurrency=1, concurrency_key="account")
    def close(account: int) -> None: ...

    @app.handler("user.created")
    def welcome(user: int) -> None: ...

    queues = {handler.event: handler.queue for handler in app.handlers.values()}
    context = app.context
    assert keyed_limit(context, queues["mail.requested"]) is False
    assert keyed_limit(context, queues["account.closed"]) is True
    assert keyed_limit(context, queues["user.created"]) is None
    app.close()


def test_of_a_worker_s_processes_the_one_holding_the_longest_waiting_event_asks_first():
    from amqp_events.celery.pool.shared import Shared
    from amqp_events.celery.pool.turns import SharedTurns

    shared = Shared(2, ["mail.send", "mail.other"])
    shared.consuming[0] = shared.consuming[1] = 1
    first, second = Waiting(), Waiting()
    first.peers, second.peers = SharedTurns(shared, 0), SharedTurns(shared, 1)
    assert first.arrive("mail.send", "", "e1", now=1.0)
    assert not second.arrive("mail.send", "", "e2", now=2.0)  # e1 arrived first, in the other process
    assert first.arrive("mail.send", "", "e1", now=2.0)
    assert second.arrive("mail.other", "", "o1", now=2.0) and second.arrive("mail.send", "3", "k1", now=2.0)
    first.started("w", lasts=1.0, now=2.0, handler="mail.send")  # e1 took the start: the other knows when it ends
    first.leave("mail.send", "e1")
    assert second.arrive("mail.send", "", "e2", now=2.1)
    assert second.until_free("w2", spacing=1.0, now=2.5, handler="mail.send") == pytest.approx(0.501)
    shared.process_ended(1)  # its process died: what it held went back, and waits for nobody
    assert first.arrive("mail.send", "", "e3", now=3.0)


def test_an_event_that_never_comes_back_to_ask_stops_holding_up_those_behind_it():
    from amqp_events.celery.pool.shared import Shared
    from amqp_events.celery.pool.turns import SharedTurns
    from amqp_events.limits.waiting import GONE_AFTER

    shared = Shared(2, ["mail.send"])
    shared.consuming[0] = shared.consuming[1] = 1
    first, second = Waiting(), Waiting()
    first.peers, second.peers = SharedTurns(shared, 0), SharedTurns(shared, 1)
    assert first.arrive("mail.send", "", "lost", now=1.0)
    assert first.hold("mail.send", "", "lost", now=1.0, seconds=0.5) == 0.5  # to ask again at 1.5: it never does
    assert not first.arrive("mail.send", "", "next", now=2.0) and not second.arrive("mail.send", "", "e", now=2.0)
    late = 1.5 + GONE_AFTER + 0.1
    assert second.arrive("mail.send", "", "e", now=late)  # the other process no longer waits for it
    assert first.arrive("mail.send", "", "next", now=late)  # nor its own line
    assert list(first.lines[("mail.send", "")].ids) == ["next"]
