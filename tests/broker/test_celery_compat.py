"""Each adjustment of Celery's internals (the adapter, amqp_events.celery) is still called by the Celery installed.

If an upgrade of Celery, kombu or billiard moves a hook, one of these fails.
Broker tests cover the behaviour each adjustment exists for: the handler
loading tests (the queue table), test_worker_startup (no DelayedDelivery
queues), test_worker_lost (lost pool processes), test_bad_input (messages
the worker cannot run) and test_settings (settings read once).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
from typing import Any

import pytest
from celery import signals
from celery.app.amqp import AMQP
from celery.contrib.testing.worker import start_worker
from celery.worker.consumer import Consumer
from celery.worker.request import Request
from celery.worker.worker import WorkController
from kombu.asynchronous import Hub
from kombu.asynchronous.timer import Timer
from vine import promise

from amqp_events import Middleware, events_app
from amqp_events.celery import conf as celery_conf
from amqp_events.celery import consumer, queues
from amqp_events.celery import loop as event_loop
from amqp_events.testing import wait_for


def test_celery_reads_the_queue_table_before_it_imports_worker_include_modules():
    """Why EventQueues follows the handlers: the order inside WorkController.setup_instance."""
    source = inspect.getsource(WorkController.setup_instance)
    assert source.index("self.setup_queues(") < source.index("self.setup_includes(")
    assert "consume_from" in inspect.getsource(AMQP.TaskConsumer)


def test_the_queue_table_follows_handlers_registered_after_it_was_built():
    app = events_app("orders", broker_url="amqp://localhost//")
    table = app.amqp.queues  # what a worker reads before `--include` modules are imported
    assert isinstance(table, queues.EventQueues) and "celery" not in table

    @app.handler("billing.invoice.paid")
    def on_paid(invoice_id: int) -> None: ...

    assert list(table.consume_from) == ["orders:billing.invoice.paid"]

    @app.handler("users.registered")
    def on_registered(user_id: int) -> None: ...

    table.select(["orders:users.registered"])  # `celery worker -Q ...`
    assert list(table.consume_from) == ["orders:users.registered"]
    assert table["orders:users.registered"].queue_arguments["x-queue-type"] == "quorum"


def test_the_delayed_delivery_step_left_out_is_still_called_that():
    assert any(step.endswith(":DelayedDelivery") for step in Consumer.Blueprint.default_steps)
    assert not any(step.endswith(":DelayedDelivery") for step in consumer.EventConsumer.Blueprint.default_steps)


def test_the_task_handler_still_makes_its_ack_promises_with_the_promise_it_is_given():
    assert "promise" in inspect.signature(Consumer.create_task_handler).parameters
    source = inspect.getsource(Consumer.create_task_handler)
    assert "promise(" in source and ("call_soon_ack," in source or "call_soon," in source)


def test_acks_now_runs_ack_callbacks_at_once_and_leaves_other_promises_alone():
    done: list[str] = []

    def deferred(p, *args):  # stands for Consumer.call_soon: queues for later
        done.append("deferred")

    acks = event_loop.acks_now(promise, deferred=(deferred,))
    acks(deferred, (lambda *args: done.append("acked"),))("logger", "errors")
    acks(lambda *args: done.append("other"), ())()
    assert done == ["acked", "other"]


@pytest.fixture
def root_logger_kept():
    """Celery's ``start_worker`` sets up logging (the root logger at its level 'error'): put it back after."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def test_a_solo_worker_sends_each_ack_of_celery_s_path_at_once(broker_url, monkeypatch, root_logger_kept):
    """In a real worker (in this process, solo pool), a message that takes Celery's own request path (a receiver
    of its task signals is connected) has its ack sent through the hook, not queued behind the loop's poll."""
    app = events_app("compat", broker_url=broker_url)
    handled: list[int] = []

    @app.handler("compat.ping")
    def on_ping(n: int) -> None:
        handled.append(n)

    def prerun(**_: object) -> None:
        pass

    sent_at_once: list[str] = []
    real = event_loop.call_now
    monkeypatch.setattr(event_loop, "call_now", lambda *a, **kw: (sent_at_once.append("ack"), real(*a, **kw)))
    signals.task_prerun.connect(prerun)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
            for n in range(5):
                app.fire("compat.ping", [n], {})
            wait_for(lambda: len(sent_at_once) >= 5, 30, what="five acks sent at once")
    finally:
        signals.task_prerun.disconnect(prerun)
    assert sorted(handled) == [0, 1, 2, 3, 4]
    app.close()


def test_celery_s_test_worker_runs_the_event_loop_in_a_thread_of_its_own_which_steps_the_coroutines(
    broker_url, root_logger_kept
):
    """``start_worker`` makes the consumer in this thread and runs its event loop in another: an async middleware
    hook around the first (plain) handler's run waits on the coroutines' loop from the event loop's thread."""
    app = events_app("compat", broker_url=broker_url)
    handled: list[tuple[str, str]] = []

    class AsyncHook(Middleware):
        async def before_handle(self, attempt: Any) -> None:
            await asyncio.sleep(0.01)

    app.add_middleware(AsyncHook())

    @app.handler("compat.ping")
    def on_ping(n: int) -> None:
        handled.append(("plain", threading.current_thread().name))

    @app.handler("compat.pong")
    async def on_pong(n: int) -> None:
        handled.append(("coroutine", threading.current_thread().name))

    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        app.fire("compat.ping", [1], {})
        wait_for(lambda: len(handled) == 1, 30, what="the plain handler's run, its async hook awaited")
        app.fire("compat.pong", [2], {})
        wait_for(lambda: len(handled) == 2, 30, what="the coroutine handler's run")
    assert handled[0][1] == handled[1][1] != threading.current_thread().name  # both in the event loop's thread
    app.close()


def test_a_lost_process_is_still_reported_to_on_failure_with_these_arguments():
    parameters = inspect.signature(Request.on_failure).parameters
    assert list(parameters) == ["self", "exc_info", "send_failed_event", "return_ok"]
    assert hasattr(Request, "_already_cancelled") and hasattr(Request, "_already_revoked")


def test_the_waker_ends_a_poll_of_the_event_loop_at_once():
    hub = Hub()
    waker = event_loop.LoopWaker(hub)
    hub.call_later(60, lambda: None)  # the loop polls as long as it may (up to 10 s)
    loop = hub.create_loop()
    next(loop)  # first turn: sets up the loop
    turned = threading.Event()
    thread = threading.Thread(target=lambda: (next(loop), turned.set()), daemon=True)
    thread.start()
    assert not turned.wait(0.5)  # asleep in poll()
    waker.wake()
    assert turned.wait(5), "the loop did not wake up"
    waker.close()
    hub.close()


def test_what_another_thread_queued_on_the_hub_runs_when_asked():
    hub = Hub()
    ran: list[str] = []
    queuing = threading.Thread(target=hub.call_soon, args=(ran.append, "an ack"))
    queuing.start()
    queuing.join(5)
    event_loop.run_queued(hub)
    assert ran == ["an ack"]
    event_loop.run_queued(hub)  # taken: run once
    assert ran == ["an ack"]
    hub.close()


def test_the_waker_is_read_again_after_the_hub_is_reset():
    """Upstream: the worker's event loop resets its hub (every reader dropped) when a connection is lost."""
    hub = Hub(timer=Timer(max_interval=60))
    waker = event_loop.LoopWaker(hub)
    hub.reset()
    waker.keep_reading()
    quiet, never_written = os.pipe()
    hub.add_reader(quiet, lambda: None)  # with a reader, the loop polls as long as it may (up to 10 s)
    hub.call_later(60, lambda: None)
    loop = hub.create_loop()
    waker.wake()
    next(loop)  # first turn: sets up the loop
    turned = threading.Event()
    thread = threading.Thread(target=lambda: (next(loop), turned.set()), daemon=True)
    thread.start()
    waker.wake()
    assert turned.wait(5), "the loop did not wake up"
    waker.close()
    hub.close()
    os.close(quiet)
    os.close(never_written)


def test_settings_changes_still_go_through_the_guarded_methods():
    app = events_app("orders")
    conf = app.conf
    assert type(conf).__setattr__ is not object.__setattr__  # attribute writes become item writes
    assert app.events_settings.exchange == "events"  # read: from now on they are guarded
    assert isinstance(app.conf, celery_conf.GuardedSettings) and app.conf is conf
    with pytest.raises(Exception, match="cannot change now"):
        conf.setdefault("amqp_events_exchange", "x")  # not set yet: it would change what was read


def test_the_worker_command_still_names_a_worker_celery_at_its_host_by_default():
    """Why EventsWorker names a worker after its service when ``-n`` is left out: what that default is."""
    from celery.bin.worker import worker
    from celery.utils.nodenames import default_nodename, host_format

    [option] = [parameter for parameter in worker.params if parameter.name == "hostname"]
    assert option.default == host_format(default_nodename(None))
    app = events_app("orders")
    assert app.Worker(hostname=option.default, pool_cls="solo").hostname.startswith("orders-")


def test_celery_s_retry_options_are_the_library_s_or_refused_with_the_equivalent():
    from celery import Task

    app = events_app("retrying", broker_url="amqp://in-process.invalid//")

    @app.handler("a.one", retry_backoff=5, retry_backoff_max=60, retry_jitter=True, dont_autoretry_for=(KeyError,))
    def one(): ...

    class Two(Task):
        max_retries = 2

        def run(self): ...

    app.handler("a.two")(Two)
    assert dict(app.handlers["a.one"].retry_options) == {
        "backoff_base": 5.0, "backoff_max": 60.0, "jitter": True, "dont_retry": (KeyError,)
    }  # fmt: skip
    assert dict(app.handlers["a.two"].retry_options) == {"max_retries": 2}

    def anything() -> None: ...

    with pytest.raises(TypeError, match=r"autoretry_for=.*dont_retry"):
        app.handler("a.three", autoretry_for=(ConnectionError,))(anything)
    with pytest.raises(TypeError, match=r"default_retry_delay.*countdown"):
        app.handler("a.four", default_retry_delay=30)(anything)
    app.handler("a.five", autoretry_for=(Exception,))(anything)  # what the library does anyway


def test_time_limits_on_a_pool_that_cannot_enforce_them_are_said_at_start(worker):
    process = worker("orders", env={"TIME_LIMIT": "5"})
    assert "does not enforce them" in process.log()
