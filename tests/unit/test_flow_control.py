"""Flow control (``concurrency=``, ``rate_limit=``): the options as written, and limits in the in-process mode on
its virtual clock. Over the fleet, on RabbitMQ: ``tests/broker/test_flow_control.py``."""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amqp_events import EventsApp, events_app
from amqp_events.errors import LimitUnavailable
from amqp_events.limits import Rate, parse_rates
from amqp_events.limits.middleware import UNAVAILABLE_WAIT, HotKeys
from amqp_events.limits.operations import limited_handler, limits_set, set_limit
from amqp_events.limits.options import limits_of
from amqp_events.limits.overrides import Override, decode, encode
from amqp_events.testing.in_process import in_process
from amqp_events.topology.limits import window
from amqp_events.transport.leases import Ahead

URL = "amqp://mailer:secret@in-process.invalid//"


@pytest.fixture
def mailer() -> Iterator[EventsApp]:
    app = events_app("mailer", broker_url=URL)
    yield app
    app.close()


def test_rates_are_read_as_celery_writes_them_and_a_day_and_multiples_besides():
    assert parse_rates("50/m") == (Rate(50, 60),)
    assert parse_rates("100000/d, 10/s") == (Rate(10, 1), Rate(100000, 86400))
    assert parse_rates("5/10s") == (Rate(5, 10),)
    assert [str(rate) for rate in parse_rates("10/s,100000/d,5/10s,7/2h")] == ["10/s", "5/10s", "7/2h", "100000/d"]
    assert Rate(50, 60).spacing == 1.2


@pytest.mark.parametrize("written", ["", "50", "50/x", "0/m", "5/0s", "-1/s", "10/s,20/s", "ten/s", "5/m;"])
def test_a_rate_that_is_not_one_is_refused_saying_how_to_write_it(written):
    with pytest.raises(ValueError, match=r"rate|window|count"):
        parse_rates(written)


@given(st.lists(st.tuples(st.integers(1, 10**6), st.sampled_from("smhd"), st.integers(1, 9)), min_size=1, max_size=4))
def test_a_rate_written_back_reads_as_itself(parts):
    written = ",".join(f"{count}/{multiple}{unit}" for count, unit, multiple in parts)
    try:
        rates = parse_rates(written)
    except ValueError as exc:
        assert "twice" in str(exc)  # two parts with one window
        return
    assert parse_rates(",".join(map(str, rates))) == rates


def test_the_options_are_checked_when_the_handler_is_registered(mailer):
    with pytest.raises(TypeError, match="concurrency=0 must be at least 1"):
        mailer.handler("mail.send", concurrency=0)(lambda to: None)
    with pytest.raises(TypeError, match="rate_limit='50/x'"):
        mailer.handler("mail.send", rate_limit="50/x")(lambda to: None)
    with pytest.raises(TypeError, match="concurrency_key= needs the limit it keys"):
        mailer.handler("mail.send", concurrency_key="to")(lambda to: None)
    with pytest.raises(TypeError, match="'account' is not one of its event's arguments"):
        mailer.handler("mail.send", concurrency=1, concurrency_key="account")(lambda to: None)
    with pytest.raises(TypeError, match="ordered handler"):
        mailer.handler("mail.send", ordered_by="to", concurrency=1)(lambda to: None)


def test_celery_s_rate_limit_on_a_handler_is_the_fleet_wide_one_and_celery_s_own_is_left_unset(mailer):
    @mailer.handler("mail.send", rate_limit="50/m")
    def send(to: str) -> None: ...

    task = mailer.tasks["mail.send"]
    assert task.rate_limit is None  # Celery would count per worker process, holding what waits in memory
    assert limits_of(mailer.handlers["mail.send"]).rates == (Rate(50, 60),)


def test_celery_s_app_wide_rate_limits_never_reach_a_handler_and_say_why(caplog):
    caplog.set_level(logging.WARNING, "amqp_events.celery.task")  # whatever level an earlier test left the root at
    app = events_app(
        "mailer", broker_url=URL, task_default_rate_limit="10/s", task_annotations={"mail.audit": {"rate_limit": "5/s"}}
    )

    @app.handler("mail.send", rate_limit="50/m")
    def send(to: str) -> None: ...

    @app.handler("mail.audit")
    def audit(to: str) -> None: ...

    @app.task(name="reports.daily")
    def daily() -> None: ...

    app.finalize()
    assert app.tasks["mail.send"].rate_limit is None and app.tasks["mail.audit"].rate_limit is None
    assert app.tasks["reports.daily"].rate_limit == "10/s"  # a plain task keeps Celery's own
    assert "mail.send: Celery's rate limit '10/s'" in caplog.text and "give the handler rate_limit=" in caplog.text
    app.close()


def test_200_events_at_50_a_minute_start_one_every_1_2_s_in_order_on_the_virtual_clock_and_no_minute_has_more(mailer):
    @mailer.event("mail.requested")
    def requested(n: int) -> None: ...

    @mailer.handler("mail.requested", rate_limit="50/m")
    def send(n: int) -> None: ...

    with in_process(mailer) as events:
        for n in range(200):
            requested(n)
        took = events.drain()
        runs = [run for run in events.handled("mailer") if run.outcome == "success"]
        waits = [run for run in events.runs if run.outcome != "success"]
    assert [run.kwargs["n"] for run in runs] == list(range(200))  # each once, in the order fired
    assert 199 * 1.2 <= took <= 199 * 1.2 * 1.03  # paced: one start every 1.2 s (and its hundredth)
    starts = [run.at for run in runs]
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(starts)]
    assert min(gaps) >= 1.2 and max(gaps) <= 1.2 * 1.03  # evenly, not 50 at once and then nothing
    for first in starts:  # every 60-second window from a start holds at most 50
        assert sum(1 for at in starts if 0 <= (at - first).total_seconds() < 60) <= 50
    # A wait is not an attempt (never a retry), and it waits held by the worker, never on the delay ladder.
    assert {run.outcome for run in waits} == {"held"}
    assert {run.attempt for run in runs} == {1}


def test_a_rate_per_key_holds_each_key_back_and_lets_the_others_go(mailer):
    @mailer.event("mail.requested")
    def requested(account: str, n: int) -> None: ...

    @mailer.handler("mail.requested", rate_limit="2/m", rate_limit_key="account")
    def send(account: str, n: int) -> None: ...

    with in_process(mailer) as events:
        for n in range(6):
            requested("hot", n)
        requested("cold", 0)
        first = Counter(run.kwargs["account"] for run in events.handled("mailer") if run.outcome == "success")
        assert first == {"hot": 1, "cold": 1}  # the cold account is not held up behind the hot one
        assert 5 * 30 <= events.drain() <= 5 * 30 * 1.03  # paced: one start of a key every 30 s
        ran = [run for run in events.handled("mailer") if run.outcome == "success"]
    assert Counter(run.kwargs["account"] for run in ran) == {"hot": 6, "cold": 1}
    assert [run.kwargs["n"] for run in ran if run.kwargs["account"] == "hot"] == list(range(6))  # in order


def test_an_event_without_its_key_is_archived_as_bad_arguments(mailer):
    @mailer.event("mail.requested")
    def requested(n: int) -> None: ...

    @mailer.handler("mail.requested", concurrency=1, concurrency_key=lambda n: {"odd": 1}[n])
    def send(n: int) -> None: ...

    with in_process(mailer) as events:
        requested(2)
        [archived] = events.archived("mailer")
    assert archived.reason == "bad_arguments" and "no key" in archived.exception_message


@pytest.fixture
def fifty_a_minute(mailer: EventsApp) -> Callable[[int], None]:
    """``mail.requested``, handled by ``send`` at 50 a minute in its code: the event to fire."""

    @mailer.event("mail.requested")
    def requested(n: int) -> None: ...

    @mailer.handler("mail.requested", rate_limit="50/m")
    def send(n: int) -> None: ...

    return requested


def test_a_limit_set_at_run_time_is_in_force_at_once_in_the_in_process_mode_and_a_reset_goes_back(
    mailer, fifty_a_minute
):
    with in_process(mailer) as events:
        handler = limited_handler(mailer.handlers, "send")
        assert set_limit(mailer.transport, "mailer", handler, rate_limit="100/m").rates == (Rate(100, 60),)
        for n in range(200):
            fifty_a_minute(n)
        assert 60 <= events.drain() <= 120 + 10  # 100 a minute: two minutes, not four
        assert limits_set(mailer.transport, "mailer") == {"mail.requested": Override(None, "100/m")}
        assert set_limit(mailer.transport, "mailer", handler, reset=True) == limits_of(handler)
        assert limits_set(mailer.transport, "mailer") == {}


def test_a_broker_out_of_reach_makes_an_event_wait_unrun_and_the_limits_set_at_run_time_stay(
    mailer, fifty_a_minute, monkeypatch
):
    """The node holding the stream of limits or a window lost (or flow control's connection): never an attempt."""
    with in_process(mailer) as events:
        handler = limited_handler(mailer.handlers, "send")
        set_limit(mailer.transport, "mailer", handler, rate_limit="100/m")
        fifty_a_minute(0)  # the table is read
        transport = type(mailer.transport)
        lost = iter(range(6))

        def out_of_reach(real):  # the first six calls of either find the broker out of reach
            def call(self, *args):
                if next(lost, None) is not None:
                    raise LimitUnavailable("flow control's connection to the broker failed: ConnectionResetError()")
                return real(self, *args)

            return call

        monkeypatch.setattr(transport, "limit_table", out_of_reach(transport.limit_table))
        monkeypatch.setattr(transport, "admit", out_of_reach(transport.admit))
        for n in range(1, 200):
            fifty_a_minute(n)
        assert 60 <= events.drain() <= 120 + 10 + 6 * UNAVAILABLE_WAIT  # 100 a minute (not 50): the table stayed
        runs = [run for run in events.handled("mailer") if run.outcome == "success"]
    assert [run.kwargs["n"] for run in runs] == list(range(200))
    assert {run.attempt for run in runs} == {1}  # waiting for the broker was never an attempt


def test_only_a_handler_with_a_limit_in_its_code_takes_one_at_run_time(mailer):
    @mailer.handler("mail.requested", concurrency=2)
    def send(n: int) -> None: ...

    @mailer.handler("mail.requested", name="audit")
    def audit(n: int) -> None: ...

    assert limited_handler(mailer.handlers, "send").task_name == "mail.requested"
    with pytest.raises(LookupError, match="no limit in its code"):
        limited_handler(mailer.handlers, "audit")
    with pytest.raises(LookupError, match=r"'mail\.requested' names 2 handlers \(mail\.requested, "):
        limited_handler(mailer.handlers, "mail.requested")
    # An operator's typo: the handlers that take a limit, by the names an operator types.
    with pytest.raises(LookupError, match=r"^no handler is called 'sned'; those with a limit in their code: send "):
        limited_handler(mailer.handlers, "sned")


rows = st.builds(
    Override,
    st.none() | st.integers(1, 10_000),
    st.none() | st.builds(lambda rates: ",".join(map(str, rates)), st.lists(st.builds(Rate, st.integers(1, 10**6),
        st.sampled_from([1, 60, 3600, 86400])), min_size=1, max_size=4, unique_by=lambda rate: rate.seconds)),
)  # fmt: skip


@given(st.dictionaries(st.text(min_size=1, max_size=40), rows, max_size=8))
def test_a_table_of_limits_reads_back_as_written(table):
    assert decode(encode(table)) == table


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@given(st.binary(max_size=300) | json_values.map(lambda value: json.dumps({"handlers": value}).encode()))
def test_anything_else_on_the_stream_of_limits_is_refused_whole_with_a_reason(body):
    """The stream is read from the broker: whatever is on it, a worker gets a table or a ValueError, never a crash."""
    try:
        table = decode(body)
    except ValueError as exc:
        assert str(exc)
    else:
        assert all(isinstance(row, Override) for row in table.values())


def test_hot_keys_are_named_in_the_metrics_up_to_a_bound_and_the_rest_are_other():
    keys = HotKeys(top=2, hot=3, tracked=50)
    assert keys.label("send", None) == ""
    assert [keys.label("send", "acme") for _ in range(3)] == ["other", "other", "'acme'"]  # hot on its third wait
    assert keys.label("send", "acme") == "'acme'"
    for _ in range(3):
        keys.label("send", 7)
    assert [keys.label("send", "third") for _ in range(5)] == ["other"] * 5  # two named already
    assert keys.label("send", "x" * 500) == "other"
    named = [keys.label("audit", "y" * 500) for _ in range(3)][-1]  # another handler has a bound of its own
    assert named == repr("y" * 500)[:64]


@pytest.mark.skipif(importlib.util.find_spec("prometheus_client") is None, reason="the [metrics] extra")
def test_the_metrics_count_starts_waits_and_runs_holding_a_place(mailer):
    from prometheus_client import REGISTRY

    @mailer.event("mail.requested")
    def requested(n: int) -> None: ...

    @mailer.handler("mail.requested", rate_limit="5/m", concurrency=2)
    def send(n: int) -> None:
        held.append(REGISTRY.get_sample_value("amqp_events_limit_runs", labels))

    held: list[float | None] = []
    labels = {"service": "mailer", "handler": limited_handler(mailer.handlers, "send").name}

    def value(name: str, **more: str) -> float:
        return REGISTRY.get_sample_value(name, {**labels, **more}) or 0.0

    starts, waits = (
        value("amqp_events_limit_starts_total"),
        value("amqp_events_limit_waits_total", limit="rate", key=""),
    )
    with in_process(mailer) as events:
        for n in range(8):
            requested(n)
        events.drain()
    assert value("amqp_events_limit_starts_total") - starts == 8
    assert value("amqp_events_limit_waits_total", limit="rate", key="") - waits >= 3  # the sixth to eighth waited
    assert held and all(running is not None and running >= 1 for running in held)  # its own place, while it ran
    assert value("amqp_events_limit_runs") == 0  # every place given back


@given(st.lists(st.tuples(st.floats(0, 0.5), st.booleans()), max_size=200), st.integers(1, 64))
def test_starts_taken_ahead_are_used_only_in_time_and_asked_for_within_bounds(steps, most):
    """Whatever the pace of runs and whether the window has room, a start taken ahead is used only within its
    time, and a process never asks for fewer than one or more than its bound."""
    ahead, now, taken_at = Ahead(most, seconds=0.2), 0.0, 0.0
    for pause, room in steps:
        now += pause
        if ahead.use(now):
            assert now - taken_at < 0.2
            continue
        asked = ahead.asking
        assert 1 <= asked <= most
        ahead.took(asked, asked if room else 0, now)
        taken_at = now


def test_a_process_takes_more_starts_ahead_while_it_uses_them_all_and_fewer_when_they_go_unused():
    ahead = Ahead(most=64, seconds=1.0)
    asked = []
    for tick in range(200):  # a run every millisecond: each batch is used up in time
        now = tick / 1000
        if not ahead.use(now):
            asked.append(ahead.asking)
            ahead.took(ahead.asking, ahead.asking, now)
    assert asked[:7] == [1, 2, 4, 8, 16, 32, 64] and set(asked[7:]) == {64}
    assert not ahead.use(5.0) and ahead.asking == 32  # a pause: what was left went unused
    ahead.took(32, 5, 5.0)  # the window had room for 5 only
    assert ahead.asking == 1
    ahead.took(1, 0, 6.0)  # refused: no start was taken, none was used up
    assert not ahead.use(6.1) and ahead.asking == 1  # so the next ask is for one again, not two


def test_a_window_is_bounded_in_bytes_and_large_ones_are_taken_several_starts_at_a_time():
    limited = window("mailer.limit.t", 10, 60_000, False)
    assert limited.queue.name == "mailer.limit.t.10per60s"
    assert limited.queue.queue_arguments["x-max-length-bytes"] == 10
    assert limited.queue.queue_arguments["x-overflow"] == "reject-publish"
    assert limited.queue.queue_arguments["x-message-ttl"] == 60_000 + 2 * 1000  # a slack to begin, one to be used
    assert (limited.most_ahead, limited.ahead_seconds) == (1, 1.0)
    assert window("mailer.limit.t", 1000, 60_000, False).most_ahead == 62
    assert window("mailer.limit.t", 100_000, 1000, False).most_ahead == 64
    assert window("mailer.limit.t", 100, 1000, False).ahead_seconds == 0.02
    paced = window("mailer.limit.t", 1, 1200, False, paced=True)  # "50/m", one in any 1.2 s
    assert paced.queue.name == "mailer.limit.t.1per1200ms"
    assert paced.queue.queue_arguments["x-message-ttl"] == 1200 + 2 * 12 and paced.lasts == 1.224
