"""The in-process mode: services' handlers run in the test's own thread, fed by a broker in memory on a virtual clock.

::

    from amqp_events.testing import in_process

    def test_a_paid_invoice_is_shipped():
        with in_process(billing.app, shipping.app) as events:
            invoice_paid(42, "10.00")            # handled before it returns
            [run] = events.handled("shipping")
            assert run.kwargs == {"invoice_id": 42, "amount": "10.00"}

While it is on, the apps given to :func:`in_process` send to it instead of
RabbitMQ (each app's own transport and clock, as dramatiq's ``StubBroker``
is a broker of its own: another app of the process still talks to its
broker), and their handlers run. What a handler's message goes through is
the real thing: JSON encoding and decoding by kombu, the consumer's checks,
Celery's request and trace, the library's handling pipeline and outcome rules
(retries, their backoff and counts, the archive and its record). What is
simulated is only the broker (:mod:`amqp_events.transport.memory`, built from
the same topology a worker declares) and time: delays and retries wait on
:attr:`InProcess.clock`, which the test moves on.

Not modelled (test these with real workers, :mod:`amqp_events.testing.fixtures`):
a worker process lost while running a handler (raises :class:`NotModelled`),
the broker or a node going down, prefetch and concurrency (handlers run one
at a time, in arrival order), and time as the handler's own code reads it
(only the library's timestamps follow the virtual clock).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from typing import Any, Literal

from kombu.serialization import loads

from amqp_events.archive import Archive, ArchivedMessage
from amqp_events.celery import EventsApp
from amqp_events.celery.inline import InlineWorker
from amqp_events.core.context import Attempt, Middleware
from amqp_events.core.outcome import Outcome, Redeliver, SendToArchive
from amqp_events.errors import NotModelled, Refused, UnhandledEvent
from amqp_events.metrics import AVAILABLE as METRICS
from amqp_events.middleware.metrics import HandlerMetrics
from amqp_events.testing.in_process.prefetch import Prefetch
from amqp_events.testing.in_process.records import FiredEvent, Run, VirtualClock, Waiting
from amqp_events.testing.in_process.transport import InProcessTransport, MemoryChannel
from amqp_events.testing.in_process.virtual_timers import VirtualTimers
from amqp_events.topology import delays
from amqp_events.topology.names import is_direct_exchange, to_queue
from amqp_events.transport.memory import Envelope, MemoryBroker
from amqp_events.wire import cloud_events
from amqp_events.wire.message import JSON, OutgoingMessage, event_id, event_name

__all__ = ["FiredEvent", "InProcess", "NotModelled", "Run", "UnhandledEvent", "VirtualClock", "Waiting", "in_process"]

#: Messages handled at one point of virtual time before the mode concludes handlers fire what they handle.
MAX_RUNS_AT_ONCE = 100_000
#: The mode that is on: one at a time, since handlers run in the thread that fires.
_on: InProcess | None = None


class InProcess:
    """The in-process mode for some services' apps (see :func:`in_process`)."""

    def __init__(
        self,
        apps: Iterable[EventsApp],
        unhandled: Literal["raise", "ignore"] = "raise",
        start: datetime | None = None,
    ) -> None:
        if unhandled not in ("raise", "ignore"):
            raise ValueError(f"unhandled must be 'raise' or 'ignore', not {unhandled!r}")
        self.unhandled = unhandled
        self.apps: dict[str, EventsApp] = {}
        self.clock = VirtualClock(start or datetime.now(timezone.utc), self)
        self.broker = MemoryBroker(self.clock.now)
        #: Where the ordered handlers' runners hold retries: on the virtual clock.
        self.timers = VirtualTimers(self.clock.now)
        #: Each consumed queue's worker.
        self.workers: dict[str, InlineWorker] = {}
        self.prefetch = Prefetch()
        for app in apps:
            self._add(app)
        #: The events some service of the test handles.
        self.subscribed = {app.topology.queue(queue).routing_key for queue, app in self._consumers()}
        #: Every event fired, in order.
        self.fired: list[FiredEvent] = []
        #: Every outcome of every message, in order.
        self.runs: list[Run] = []
        self.transport = InProcessTransport(self)
        self._unhandled: list[str] = []
        self._running = False
        self._on = ExitStack()

    def _add(self, app: EventsApp) -> None:
        if app.service in self.apps:
            raise ValueError(f"two apps of service {app.service!r}: give in_process() one app per service")
        app.loader.import_default_modules()  # the handlers of imports=/include=, as a worker imports them
        self.apps[app.service] = app
        topology = app.topology
        self.broker.declare(topology)
        worker = InlineWorker(app, self.timers)
        for queue in topology.event_queues:
            self.workers[queue.name] = worker
            self.prefetch.add(app.context, queue.name)

    def _consumers(self) -> Iterator[tuple[str, EventsApp]]:
        return ((queue, worker.app) for queue, worker in self.workers.items())

    # -- on and off ---------------------------------------------------------------------------------

    def start(self) -> InProcess:
        global _on
        if _on is not None:
            raise RuntimeError("the in-process mode is on already: one at a time")
        recorder = Recorder(self)
        try:
            for app in self.apps.values():
                # Metrics as a worker that serves them records them (with prometheus-client installed).
                metrics = [HandlerMetrics(app.events_settings.metrics_exception_labels)] if METRICS else []
                # Its messages go out as its broker URL's user, whose user_id the broker in memory verifies too.
                transport = InProcessTransport(self, app.rabbitmq.user)
                self._on.enter_context(app.using(transport, self.clock, *metrics, recorder))
        except BaseException:
            self._on.close()
            raise
        _on = self
        return self

    def stop(self) -> None:
        global _on
        self._on.close()
        if _on is self:
            _on = None

    def __enter__(self) -> InProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- time ---------------------------------------------------------------------------------------

    def run_until(self, until: datetime) -> None:
        """Handle what is due now, then let time pass until ``until`` (see :meth:`VirtualClock.advance`)."""
        with self._loop():
            self._run_due()
            while (due := self._next_due()) is not None and due <= until:
                self._pass_to(due)
            self.clock.move_to(until)

    def drain(self, within: float | None = None) -> float:
        """Let time pass until no message waits anywhere, handling everything; returns the seconds that passed.

        With ``within`` seconds, fail (``AssertionError``) if messages would still wait after that long.
        """
        started = self.clock.now()
        with self._loop():
            self._run_due()
            while (due := self._next_due(dead_lettering_only=True)) is not None:
                if within is not None and (due - started).total_seconds() > within:
                    raise AssertionError(f"messages still wait after {within:g}s: {self.waiting()}")
                self._pass_to(due)
        return (self.clock.now() - started).total_seconds()

    def _next_due(self, dead_lettering_only: bool = False) -> datetime | None:
        """When the next message's TTL runs out, or a held retry is due."""
        times = (self.broker.next_expiry(dead_lettering_only), self.timers.next_due())
        return min((due for due in times if due is not None), default=None)

    def _pass_to(self, due: datetime) -> None:
        self.clock.move_to(due)
        self.broker.expire()
        self.timers.run_due()
        self._run_due()

    def run_due(self) -> None:
        """Handle every message due now (after a publish from outside a handler)."""
        if not self._running:
            with self._loop():
                self._run_due()

    @contextmanager
    def _loop(self) -> Iterator[None]:
        if self._running:
            raise RuntimeError("the in-process mode is running handlers already: not from inside a handler")
        self._running = True
        try:
            yield
        finally:
            self._running = False
        self._raise_unhandled()

    def _run_due(self) -> None:
        for _ in range(MAX_RUNS_AT_ONCE):
            taken = self.broker.oldest(self.prefetch.consumable(self.workers))
            if taken is None:
                return
            queue, envelope = taken
            self._consume(queue, envelope)
        raise RuntimeError(
            f"{MAX_RUNS_AT_ONCE} messages handled at {self.clock.now()} without time passing: "
            "do handlers fire the events they handle?"
        )

    def _consume(self, queue: str, envelope: Envelope) -> None:
        """Run ``envelope``, taken off ``queue``, as the service's worker would; it ends acked or rejected."""
        channel = MemoryChannel(self.broker, queue, envelope)
        info = {
            "exchange": envelope.exchange,
            "routing_key": envelope.routing_key,
            "redelivered": envelope.redelivered,
            "delivery_tag": envelope.seq,
        }
        worker = self.workers[queue]
        later = worker.run(envelope.body, envelope.headers, envelope.properties, info, channel)
        if not channel.settled:
            self.prefetch.taken(queue, channel)
        if not channel.settled and not later:
            service = worker.app.service
            raise RuntimeError(f"the worker of {service!r} neither acked nor rejected {envelope.headers}")

    # -- what happened ------------------------------------------------------------------------------

    def handled(self, service: str | None = None, event: str | None = None) -> list[Run]:
        """The handler runs that succeeded, of ``service`` (and ``event``) or all, in order."""
        return [
            run
            for run in self.runs
            if run.outcome == "success"
            and (service is None or run.service == service)
            and (event is None or run.event == event)
        ]

    def archived(self, service: str) -> list[ArchivedMessage]:
        """What ``service``'s archive holds, read through :class:`~amqp_events.archive.Archive`."""
        return self.archive(service).list()

    def archive(self, service: str) -> Archive:
        """``service``'s :class:`~amqp_events.archive.Archive` (list, replay, purge, export...)."""
        if service not in self.apps:
            raise KeyError(f"service {service!r} is not in this test (services: {', '.join(self.apps) or 'none'})")
        return Archive(self.apps[service].context)

    def waiting(self) -> list[Waiting]:
        """Messages not handled yet, oldest first: held by a worker (over their limit), in services' queues, or
        waiting out a delay."""
        held = [channel for channels in self.prefetch.held.values() for channel in channels if not channel.settled]
        found = [Waiting(event_name(c.envelope.headers), event_id(c.envelope.headers), c.queue, None) for c in held]
        for queue in self.broker.queues.values():
            ladder = delays.is_ladder_level(queue.name)
            if queue.name not in self.workers and not ladder:
                continue
            for envelope in queue.messages:
                destination = queue.name
                if ladder:
                    _, destination = delays.decode_routing_key(envelope.routing_key)
                    destination = destination.removeprefix("queue.")
                headers = envelope.headers
                due = headers.get("due_at")
                found.append(
                    Waiting(
                        event_name(headers),
                        event_id(headers),
                        destination,
                        datetime.fromisoformat(due) if isinstance(due, str) else None,
                    )
                )
        return found

    def send(
        self,
        queue: str,
        body: bytes,
        headers: dict[str, Any] | None = None,
        content_type: str = JSON,
        content_encoding: str = "utf-8",
    ) -> None:
        """Put a raw message straight into ``queue`` (to test what a worker does with bad input)."""
        headers = dict(headers or {})
        message_id = str(headers.get("id") or "")
        self.transport.publish(
            OutgoingMessage(*to_queue(queue), headers, body, message_id, content_type, content_encoding)
        )

    def relay_outbox(self, app: EventsApp, engine: Any = None) -> int:
        """Publish ``app``'s committed outbox rows with the relay's own code, then handle what is due.

        The rows are read from ``engine`` (default: the app's ``outbox_url``).
        While the in-process mode is on, the in-process relay thread does not
        start: tests call this instead. Returns how many rows were published.
        """
        from amqp_events.outbox.relay import Relay

        relay = Relay(app.context, app.outbox_store(engine=engine))
        while relay.run_once():
            pass
        return relay.published

    # -- what the transport reports -----------------------------------------------------------------

    def published(self, message: OutgoingMessage, envelope: Envelope, routed: bool) -> None:
        """Note a fired event (and whether anyone handles it)."""
        name = message.event
        delay, subscribed = 0, routed
        if message.delayed:
            delay, destination = delays.decode_routing_key(message.routing_key)
            if not destination.startswith("event."):
                return  # a retry's copy
            subscribed = name in self.subscribed
        elif not message.exchange or is_direct_exchange(message.exchange):
            return  # a copy for one queue: a retry, an archived or a replayed message
        if cloud_events.is_cloud_event(envelope.headers, envelope.content_type):
            try:
                event = cloud_events.read(envelope.headers, envelope.body, envelope.content_type)
            except Refused:
                return  # a foreign producer's malformed message: its worker archives it
            args, kwargs, fired_by = [], event.kwargs, event.attributes.get("source")
        else:
            args, kwargs, _ = loads(envelope.body, envelope.content_type, envelope.content_encoding, accept=[JSON])
            fired_by = message.headers.get("fired_by")
        self.fired.append(FiredEvent(name, message.message_id, tuple(args), kwargs, fired_by, self.clock.now(), delay))
        if not subscribed and self.unhandled == "raise":
            self._unhandled.append(name)
            if not self._running:
                self._raise_unhandled()

    def _raise_unhandled(self) -> None:
        if not self._unhandled:
            return
        names, self._unhandled = sorted(set(self._unhandled)), []
        raise UnhandledEvent(
            f"fired {', '.join(map(repr, names))}, which no service in this test handles "
            f"(services: {', '.join(self.apps) or 'none'}). Give in_process() the app of a service that handles "
            "it, or pass unhandled='ignore'"
        )


class Recorder(Middleware):
    """Records every outcome in the mode's :attr:`InProcess.runs`."""

    def __init__(self, mode: InProcess) -> None:
        self.mode = mode

    def after_handle(self, attempt: Attempt, outcome: Outcome | None, error: BaseException | None) -> None:
        if outcome is None:
            return
        delivery = attempt.delivery
        self.mode.runs.append(
            Run(
                service=attempt.context.name,
                handler=attempt.handler.name if attempt.handler is not None else "",
                event=delivery.event,
                event_id=delivery.event_id,
                attempt=delivery.retries + 1,
                outcome=outcome.name,
                args=tuple(delivery.args),
                kwargs=dict(delivery.kwargs),
                at=self.mode.clock.now(),
                delay=outcome.delay if isinstance(outcome, Redeliver) else None,
                reason=str(outcome.reason) if isinstance(outcome, SendToArchive) else None,
                error=getattr(outcome, "error", None),
            )
        )


def in_process(
    *apps: EventsApp, unhandled: Literal["raise", "ignore"] = "raise", start: datetime | None = None
) -> InProcess:
    """The in-process mode for these services' apps; use it as a context manager (or ``start()``/``stop()``).

    ``unhandled="raise"`` (the default) makes firing an event no service of
    the test handles an :class:`UnhandledEvent` error. ``start`` is where
    the virtual clock starts (default: now).
    """
    for app in apps:
        if not isinstance(app, EventsApp):
            raise TypeError(
                f"in_process() takes the services' apps (made with events_app), not {app!r}: "
                "e.g. in_process(orders.celery.app, billing.celery.app)"
            )
    return InProcess(apps, unhandled=unhandled, start=start)
