"""The in-process mode's own features: the clock, assertions, what it refuses to fake (no broker).

What it shares with the broker (who handles what, retries, the archive) is
proven by ``test_contract.py``, which runs the same scenarios on both.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from kombu.exceptions import EncodeError

from amqp_events import EventsApp, PermanentFailure, Reason, current_event, events_app
from amqp_events.clock import utcnow
from amqp_events.testing.in_process import NotModelled, UnhandledEvent, in_process

URL = "amqp://in-process.invalid//"  # never connected to: a connection attempt would fail the test


def url_of(user: str) -> str:
    """A broker URL with a RabbitMQ user of the service's own, as in production: the in-process mode verifies
    each message's user as RabbitMQ would, so authors are known."""
    return f"amqp://{user}:secret@in-process.invalid//"


@pytest.fixture
def billing() -> Iterator[EventsApp]:
    app = events_app("billing", broker_url=url_of("billing"))
    yield app
    app.close()


@pytest.fixture
def shipping() -> Iterator[EventsApp]:
    app = events_app("shipping", broker_url=url_of("shipping"), amqp_events_max_retries=5)
    yield app
    app.close()


def test_firing_runs_every_subscriber_before_it_returns(billing, shipping):
    calls = []

    @billing.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int, amount: str):
        if not amount:
            raise ValueError("amount required")

    @shipping.handler("billing.invoice.paid")
    def book_courier(invoice_id: int, amount: str):
        calls.append((invoice_id, amount, current_event().fired_by))

    with in_process(billing, shipping) as events:
        event_id = invoice_paid(42, "10.00")
        assert calls == [(42, "10.00", "billing")]
        with pytest.raises(ValueError, match="amount required"):
            invoice_paid(43, "")
        [fired] = events.fired
        assert (fired.name, fired.id, fired.args, fired.kwargs, fired.fired_by, fired.delay) == (
            "billing.invoice.paid",
            event_id,
            (),
            {"invoice_id": 42, "amount": "10.00"},  # by name
            "billing",
            0,
        )
        [run] = events.handled("shipping")
        assert (run.handler, run.event_id, run.attempt, run.args, run.kwargs) == (
            "unit.test_in_process.test_firing_runs_every_subscriber_before_it_returns.<locals>.book_courier",
            event_id,
            1,
            (),
            {"invoice_id": 42, "amount": "10.00"},
        )


def test_an_event_fired_again_under_its_id_is_the_same_event(billing, shipping):
    ids = []

    @shipping.handler("billing.invoice.paid")
    def book_courier(invoice_id: int):
        ids.append(current_event().id)

    with in_process(billing, shipping):
        assert billing.fire("billing.invoice.paid", [42], event_id="invoice-42-paid") == "invoice-42-paid"
        for wrong in ("", " padded ", "x" * 65, 42):
            with pytest.raises(ValueError, match="an event id must be a string of 1 to 64 characters"):
                billing.fire("billing.invoice.paid", [42], event_id=wrong)
    assert ids == ["invoice-42-paid"]


def test_payloads_go_through_json_as_on_the_wire(billing, shipping):
    received = []

    @shipping.handler("billing.invoice.paid")
    def book_courier(invoice_id, amount, when=None):
        received.append((invoice_id, amount, when))

    with in_process(billing, shipping):
        billing.fire("billing.invoice.paid", (1, ("a", "tuple")), {"when": datetime(2030, 1, 2, tzinfo=timezone.utc)})
        with pytest.raises(EncodeError):  # what kombu raises for the broker too
            billing.fire("billing.invoice.paid", (2, object()), {})
    assert received == [(1, ["a", "tuple"], datetime(2030, 1, 2, tzinfo=timezone.utc))]


def test_retries_wait_on_the_virtual_clock_then_the_archive(billing, shipping):
    attempts = []

    @shipping.handler("billing.invoice.paid")
    def book_courier(invoice_id: int, amount: str):
        attempts.append(utcnow())
        raise ConnectionError("carrier down")

    with in_process(billing, shipping) as events:
        started = events.clock.now()
        event_id = billing.fire("billing.invoice.paid", (42, "10.00"))
        events.clock.advance(0.999)
        assert len(attempts) == 1
        [waiting] = events.waiting()
        assert (waiting.event_id, waiting.destination, waiting.due_at) == (
            event_id,
            "shipping:billing.invoice.paid",
            started + timedelta(seconds=1),
        )
        events.clock.advance(29.001)
        assert [(moment - started).total_seconds() for moment in attempts] == [0, 1, 3, 7, 15]
        assert events.archived("shipping") == []
        events.clock.advance(1)
        [archived] = events.archived("shipping")
        assert (archived.id, archived.reason, archived.attempts) == (event_id, Reason.MAX_RETRIES, 6)
        assert archived.first_failure_at == started and archived.archived_at == started + timedelta(seconds=31)
        assert [(run.attempt, run.outcome, run.delay) for run in events.runs] == [
            *((attempt, "retry_scheduled", 2 ** (attempt - 1)) for attempt in range(1, 6)),
            (6, "archived", None),
        ]
        assert events.waiting() == []


def test_drain_runs_until_nothing_waits_and_can_bound_the_wait(billing, shipping):
    @shipping.handler("billing.invoice.paid", max_retries=2)
    def book_courier(invoice_id: int, amount: str):
        raise ConnectionError("carrier down")

    with in_process(billing, shipping) as events:
        billing.fire("billing.invoice.paid", (1, "1"), countdown=10)
        with pytest.raises(AssertionError, match="still wait after 5s"):
            events.drain(within=5)
        assert events.drain() == 10 + 1 + 2
        assert [run.outcome for run in events.runs] == ["retry_scheduled", "retry_scheduled", "archived"]


def test_archive_replay_purge_and_bounds_use_the_same_archive_api(billing):
    orders = events_app("orders", broker_url=URL, amqp_events_archive_max_length=2, amqp_events_archive_ttl_ms=60_000)
    fixed = False

    @orders.handler("billing.invoice.paid")
    def on_paid(invoice_id: int, amount: str):
        if not fixed:
            raise PermanentFailure("no such invoice")

    with in_process(billing, orders) as events:
        ids = [billing.fire("billing.invoice.paid", (n, "1")) for n in range(3)]
        archive = events.archive("orders")
        assert [entry.id for entry in archive.list()] == ids[1:]  # the oldest dropped at the limit
        fixed = True  # the fix is out
        assert archive.replay().replayed == ids[1:]
        assert [run.event_id for run in events.handled("orders")] == ids[1:]
        assert archive.count() == 0
        fixed = False
        billing.fire("billing.invoice.paid", (9, "1"))
        assert archive.count() == 1
        events.clock.advance(60)  # the archive's TTL
        assert archive.count() == 0
    orders.close()


def test_an_event_no_service_of_the_test_handles_is_an_error_unless_allowed(billing, shipping):
    @shipping.handler("billing.invoice.paid")
    def book_courier(invoice_id: int, amount: str):
        shipping.fire("shipping.courier.booked", (invoice_id,))

    with in_process(billing, shipping) as events:
        with pytest.raises(UnhandledEvent, match=r"'billing\.invoice\.refunded'.*services: billing, shipping"):
            billing.fire("billing.invoice.refunded", (1,))
        with pytest.raises(UnhandledEvent, match=r"'shipping\.courier\.booked'"):  # fired by a handler
            billing.fire("billing.invoice.paid", (2, "1"))
        assert [run.outcome for run in events.handled("shipping")] == ["success"]  # the handler itself succeeded
        with pytest.raises(UnhandledEvent, match=r"'billing\.invoice\.later'"):
            billing.fire("billing.invoice.later", (3,), countdown=5)
    with in_process(billing, shipping, unhandled="ignore") as events:
        billing.fire("billing.invoice.paid", (4, "1"))
        assert [fired.name for fired in events.fired] == ["billing.invoice.paid", "shipping.courier.booked"]


def test_events_fired_by_handlers_and_in_batches_are_handled_in_order(billing, shipping):
    seen = []

    @shipping.handler("billing.invoice.paid")
    def book_courier(invoice_id: int, amount: str):
        seen.append(("paid", invoice_id))
        shipping.fire("shipping.courier.booked", (invoice_id,))

    @billing.handler("shipping.courier.booked")
    def on_booked(invoice_id: int):
        seen.append(("booked", invoice_id))

    with in_process(billing, shipping):
        with billing.batch():
            billing.fire("billing.invoice.paid", (1, "1"))
            billing.fire("billing.invoice.paid", (2, "1"))
            assert seen == []  # a batch's events are handled when it ends
        assert seen == [("paid", 1), ("paid", 2), ("booked", 1), ("booked", 2)]


def test_a_handler_that_ends_its_process_is_not_faked(billing, shipping):
    @shipping.handler("billing.invoice.paid")
    def book_courier(invoice_id: int, amount: str):
        raise SystemExit(3)

    with in_process(billing, shipping), pytest.raises(NotModelled, match="lost worker processes"):
        billing.fire("billing.invoice.paid", (1, "1"))


def test_handler_metrics_are_recorded_as_by_a_worker(billing, shipping):
    from prometheus_client import REGISTRY

    @shipping.handler("billing.invoice.paid", max_retries=1)
    def book_courier(invoice_id: int, amount: str):
        raise ConnectionError("carrier down")

    with in_process(billing, shipping) as events:
        billing.fire("billing.invoice.paid", (1, "1"))
        events.drain()
    labels = {"service": "shipping", "handler": events.runs[0].handler}  # a name of this test's own

    def outcomes(outcome: str) -> float | None:
        return REGISTRY.get_sample_value("amqp_events_handler_outcomes_total", {**labels, "outcome": outcome})

    assert (outcomes("retry_scheduled"), outcomes("archived"), outcomes("success")) == (1, 1, 0)


def test_the_inbox_skips_a_duplicate_in_process(billing, tmp_path: Path):
    from sqlalchemy import create_engine

    from amqp_events.inbox import Inbox

    engine = create_engine(f"sqlite:///{tmp_path / 'inbox.sqlite3'}")
    inbox = Inbox(engine)
    inbox.create()
    payments = events_app("payments", broker_url=URL)
    effects = []

    @payments.handler("billing.invoice.paid", inbox=inbox)
    def capture(connection, invoice_id: int, amount: str):
        effects.append(invoice_id)

    with in_process(billing, payments) as events:
        event_id = billing.fire("billing.invoice.paid", (1, "1"))
        events.send(  # the same event delivered again (a redelivery, a replay without a new id)
            "payments:billing.invoice.paid",
            b'[[1, "1"], {}, {}]',
            {"task": "billing.invoice.paid", "id": event_id},
        )
        assert effects == [1]
        assert [run.outcome for run in events.runs] == ["success", "skipped"]
    payments.close()


def test_the_outbox_is_relayed_when_the_test_asks(billing, shipping, tmp_path: Path):
    from sqlalchemy import create_engine

    received = []

    @shipping.handler("billing.invoice.paid")
    def book_courier(invoice_id: int, amount: str):
        received.append(invoice_id)

    engine = create_engine(f"sqlite:///{tmp_path / 'shop.sqlite3'}")
    billing.outbox_store(engine=engine).create()
    with in_process(billing, shipping) as events:
        with engine.begin() as connection, billing.outbox(connection):
            billing.fire("billing.invoice.paid", (1, "1"))
        with engine.connect() as connection, billing.outbox(connection):
            billing.fire("billing.invoice.paid", (2, "1"))
            connection.rollback()
        assert received == []
        assert events.relay_outbox(billing, engine) == 1
        assert received == [1]


def test_one_app_per_service_and_one_mode_at_a_time(billing, shipping):
    twin = events_app("shipping", broker_url=URL)
    with pytest.raises(ValueError, match="two apps of service 'shipping'"):
        in_process(billing, shipping, twin)
    with in_process(billing), pytest.raises(RuntimeError, match="one at a time"):
        in_process(shipping).start()
    twin.close()


def test_the_clock_starts_where_asked_and_stamps_the_library_s_times(billing, shipping):
    start = datetime(2030, 1, 1, tzinfo=timezone.utc)
    stamps = []

    @shipping.handler("billing.invoice.paid")
    def book_courier(invoice_id: int, amount: str):
        stamps.append((current_event().fired_at, utcnow()))

    with in_process(billing, shipping, start=start) as events:
        billing.fire("billing.invoice.paid", (1, "1"), countdown=90)
        events.clock.advance(90)
    assert stamps == [(start, start + timedelta(seconds=90))]
    assert abs(utcnow() - datetime.now(timezone.utc)) < timedelta(seconds=5)  # the real clock again


def test_outcome_settled_receivers_see_every_outcome_and_cannot_break_one(billing, shipping):
    from amqp_events.celery.signals import outcome_settled
    from amqp_events.core.outcome import Ack
    from amqp_events.core.outcome import SendToArchive as Archive

    seen = []

    def receiver(sender, delivery, outcome, handling, **_):
        seen.append((sender, delivery.event_id, type(outcome), handling.policy.max_retries))
        raise RuntimeError("a broken receiver")

    @shipping.handler("billing.invoice.paid", max_retries=0)
    def book_courier(invoice_id: int, amount: str):
        if invoice_id:
            raise ConnectionError("carrier down")

    outcome_settled.connect(receiver)
    try:
        with in_process(billing, shipping) as events:
            ok, failed = billing.fire("billing.invoice.paid", (0, "1")), billing.fire("billing.invoice.paid", (1, "1"))
            assert [run.outcome for run in events.runs] == ["success", "archived"]
    finally:
        outcome_settled.disconnect(receiver)
    assert seen == [("shipping", ok, Ack, 0), ("shipping", failed, Archive, 0)]


def test_a_middleware_that_fails_before_the_handler_fails_the_attempt_it_never_loops_the_message(billing, shipping):
    from amqp_events import Middleware

    class Broken(Middleware):
        def before_handle(self, attempt):
            raise ImportError("no module named 'prometheus_client'")

    @billing.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int): ...

    @shipping.handler("billing.invoice.paid", max_retries=2)
    def book_courier(invoice_id: int):
        raise AssertionError("never reached: the middleware fails first")

    shipping.add_middleware(Broken())
    with in_process(billing, shipping) as events:
        invoice_paid(1)
        events.drain()
        [archived] = events.archived("shipping")
        assert archived.reason == Reason.MAX_RETRIES and "prometheus_client" in archived.exception_message
        assert archived.attempts == 3


def test_without_prometheus_client_the_in_process_mode_leaves_the_metrics_out(billing, shipping, monkeypatch):
    import sys

    mode = sys.modules["amqp_events.testing.in_process"]
    monkeypatch.setattr(mode, "METRICS", False)
    monkeypatch.setattr(mode, "HandlerMetrics", None)  # it would fail if it were made
    runs = []

    @billing.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int): ...

    @shipping.handler("billing.invoice.paid")
    def book_courier(invoice_id: int):
        runs.append(invoice_id)

    with in_process(billing, shipping):
        invoice_paid(7)
    assert runs == [7]


def test_mistakes_a_user_makes_first_are_told_in_plain_words(billing):
    import types

    @billing.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int): ...

    with pytest.raises(AttributeError, match=r"an event, not a task: fire it by calling it"):
        invoice_paid.delay(1)
    with pytest.raises(TypeError, match=r"takes the services' apps"):
        in_process(types.ModuleType("orders"))
    redis = events_app("cache", broker_url="redis://localhost:6379/0")
    with pytest.raises(ValueError, match=r"runs on RabbitMQ only"):
        redis.fire("a.b")


def test_an_ordered_handler_s_retry_keeps_its_place_and_other_keys_go_on():
    ledger = events_app("ledger", broker_url="memory://", amqp_events_partitions=1)
    accounts = events_app("accounts", broker_url="memory://")
    runs: list[tuple[str, int]] = []

    @accounts.event("accounts.money.moved")
    def moved(account: str, n: int): ...

    @ledger.handler("accounts.money.moved", ordered_by="account", bind=True)
    def on_moved(self, account: str, n: int):
        runs.append((account, n))
        if (account, n) == ("a-1", 1) and self.request.retries == 0:
            raise ValueError("once")

    with in_process(ledger, accounts) as events:
        for n in (1, 2):
            moved("a-1", n)
            moved("a-2", n)
        assert runs == [("a-1", 1), ("a-2", 1), ("a-2", 2)]  # a-1's second waits behind its first one's retry
        assert events.drain() == 1  # the retry's backoff, held by the worker (one partition: a-2 shares it)
    assert runs == [("a-1", 1), ("a-2", 1), ("a-2", 2), ("a-1", 1), ("a-1", 2)]


def test_a_receiver_of_celery_s_task_signals_gets_celery_s_path_as_in_a_solo_worker(billing, shipping):
    from celery import signals

    ran, seen = [], []

    @shipping.handler("billing.invoice.paid")
    def book(invoice_id: int):
        ran.append(invoice_id)

    def prerun(task_id=None, task=None, **_):
        seen.append(task.name)

    with in_process(billing, shipping):
        billing.fire("billing.invoice.paid", [1], {})  # the library's own path: no receiver yet
        signals.task_prerun.connect(prerun, weak=False)
        try:
            billing.fire("billing.invoice.paid", [2], {})  # Celery's Request, traced: the receiver sees it
        finally:
            signals.task_prerun.disconnect(prerun)
    assert ran == [1, 2] and seen == ["billing.invoice.paid"]


def test_events_fired_from_a_coroutine_are_handled_in_process_as_a_plain_fire_is(billing, shipping):
    import asyncio

    calls = []

    @billing.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int, amount: str):
        if not amount:
            raise ValueError("amount required")

    @shipping.handler("billing.invoice.paid")
    def book_courier(invoice_id: int, amount: str):
        calls.append(invoice_id)

    @billing.event("billing.customer.joined")
    @dataclass
    class Joined:
        customer_id: int

    @shipping.handler(Joined)
    def welcome(event: Joined):
        calls.append(f"joined {event.customer_id}")

    async def fire() -> list[str]:
        fired = [await invoice_paid.fire_async(1, "10.00"), await Joined(customer_id=9).fire_async()]
        with pytest.raises(ValueError, match="amount required"):
            await invoice_paid.fire_async(2, "")
        async with billing.batch_async() as batch:
            await invoice_paid.fire_async(3, "1.00")
            invoice_paid(4, "1.00")
            assert calls == [1, "joined 9"]  # a batch's events are handled when it ends, as on the broker
        return fired + batch.ids

    with in_process(billing, shipping) as events:
        fired = asyncio.run(fire())
        assert calls == [1, "joined 9", 3, 4]
        assert [event.id for event in events.fired] == fired


def test_coroutine_handlers_run_in_process_from_plain_code_and_from_a_coroutine(billing, shipping):
    import asyncio

    calls = []

    @billing.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int, amount: str): ...

    @shipping.handler("billing.invoice.paid")
    async def book_courier(invoice_id: int, amount: str):
        await asyncio.sleep(0)
        event = current_event()
        calls.append((invoice_id, event.attempt))
        if invoice_id == 2 and event.attempt == 1:
            raise ConnectionError("the courier's API is down")

    async def fired_from_a_coroutine() -> str:
        return await invoice_paid.fire_async(3, "1.00")  # the handler runs while this loop waits

    with in_process(billing, shipping) as events:
        invoice_paid(1, "1.00")
        invoice_paid(2, "1.00")
        assert calls == [(1, 1), (2, 1)]
        events.drain()  # the retry, after its delay on the virtual clock
        assert calls[-1] == (2, 2)
        asyncio.run(fired_from_a_coroutine())
        assert calls[-1] == (3, 1)


def test_a_middleware_hook_may_be_a_coroutine_awaited_on_the_loop_of_the_handlers(billing, shipping):
    import asyncio

    from amqp_events import Middleware

    loops: dict[str, object] = {}

    class Audit(Middleware):
        async def before_handle(self, attempt):
            await asyncio.sleep(0)
            loops["before_handle"] = asyncio.get_running_loop()

        async def after_handle(self, attempt, outcome, error):
            loops["after_handle"] = asyncio.get_running_loop()

    @billing.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int, amount: str): ...

    @shipping.handler("billing.invoice.paid")
    async def book_courier(invoice_id: int, amount: str):
        loops["handler"] = asyncio.get_running_loop()

    shipping.add_middleware(Audit())
    with in_process(billing, shipping):
        invoice_paid(1, "1.00")
    assert set(loops) == {"before_handle", "handler", "after_handle"}
    assert len({id(loop) for loop in loops.values()}) == 1


def test_a_lambda_is_a_handler_like_any_function(billing, shipping):
    seen = []
    shipping.handler("billing.invoice.paid")(lambda invoice_id, amount: seen.append((invoice_id, amount)))
    with in_process(billing, shipping):
        billing.fire("billing.invoice.paid", (7, "1.00"))
    assert seen == [(7, "1.00")]
