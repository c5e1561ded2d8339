"""The in-process mode: services' handlers run in the test's own thread, fed by a broker in memory on a virtual clock.

::

    from amqp_events.testing import in_process

    def test_a_paid_invoice_is_shipped():
        with in_process(billing.app, shipping.app) as events:
            invoice_paid(42, "10.00")            # handled before it returns
            [run] = events.handled("shipping")
            assert run.kwargs == {"invoice_id": 42, "amount": "10.00"}

While it is on, every events app of the process sends to it instead of
RabbitMQ; the apps given to :func:`in_process` are the services whose
handlers run. What a handler's message goes through is the real thing:
JSON encoding and decoding by kombu, the consumer's checks, Celery's
request and trace, the library's outcome rules (retries, their backoff and
counts, the archive and its record). What is simulated is only the broker
(:mod:`~amqp_events.testing.in_process.memory`, built from the same
topology a worker declares) and time: delays and retries wait on
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
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from kombu.serialization import dumps, loads

from amqp_events import clock, cloud_events, delays
from amqp_events.app import EventsApp
from amqp_events.archive import Archive, ArchivedMessage
from amqp_events.errors import PublishError
from amqp_events.message import JSON, OutgoingMessage, event_id, event_name
from amqp_events.outcome import Archive as Archived
from amqp_events.outcome import Delivery, Handling, Outcome, Redeliver
from amqp_events.publisher import exchange_to_declare
from amqp_events.signals import outcome_settled
from amqp_events.testing.in_process.memory import Envelope, MemoryBroker, QueueFull
from amqp_events.testing.in_process.worker import InProcessWorker, NotModelled
from amqp_events.topology import Topology
from amqp_events.transport import replace_every_broker

__all__ = ["FiredEvent", "InProcess", "NotModelled", "Run", "UnhandledEvent", "VirtualClock", "Waiting", "in_process"]

#: Messages handled at one point of virtual time before the mode concludes handlers fire what they handle.
MAX_RUNS_AT_ONCE = 100_000


class UnhandledEvent(AssertionError):
    """An event was fired that no service in the test handles (``in_process(..., unhandled="ignore")`` allows it)."""


@dataclass(frozen=True)
class FiredEvent:
    """An event fired while the in-process mode was on: its payload as handlers receive it."""

    name: str
    id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    fired_by: str | None
    at: datetime
    #: Seconds it waits before reaching its subscribers (``countdown``/``eta``).
    delay: int = 0


@dataclass(frozen=True)
class Run:
    """A message's outcome in one service: one handler run (or a message the worker could not run)."""

    service: str
    #: The handler, as ``module.qualname``; "" for a message no handler could take (e.g. an unknown event).
    handler: str
    event: str
    event_id: str
    #: 1 for the first run, 2 for the first retry, ...
    attempt: int
    #: ``success``, ``skipped`` (a duplicate, by the inbox), ``retry_scheduled`` or ``archived``.
    outcome: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    at: datetime
    #: Seconds until the retry (``retry_scheduled``).
    delay: int | None = None
    #: Why it was archived (``archived``).
    reason: str | None = None
    error: BaseException | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Waiting:
    """A message not handled yet: in a service's queue, or waiting out a delay."""

    event: str
    event_id: str
    #: Where it goes: a service's queue, or ``event.<name>`` for a delayed fire (every subscriber).
    destination: str
    due_at: datetime | None


class VirtualClock:
    """The time of the in-process mode. It starts at the real time and moves only when told to."""

    def __init__(self, start: datetime, mode: InProcess) -> None:
        self._now, self._mode = start, mode

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: what waited that long arrives, in due order, and is handled at its time."""
        self._mode.run_until(self._now + timedelta(seconds=seconds))

    def move_to(self, moment: datetime) -> None:
        self._now = max(self._now, moment)


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
        #: Each consumed queue's worker.
        self.workers: dict[str, InProcessWorker] = {}
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
        worker = InProcessWorker(app, self.broker)
        for queue in topology.event_queues:
            self.workers[queue.name] = worker

    def _consumers(self) -> Iterator[tuple[str, EventsApp]]:
        return ((queue, worker.app) for queue, worker in self.workers.items())

    # -- on and off ---------------------------------------------------------------------------------

    def start(self) -> InProcess:
        self._on.enter_context(replace_every_broker(self.transport))
        self._on.enter_context(clock.use(self.clock.now))
        outcome_settled.connect(self._settled, weak=False)
        self._on.callback(outcome_settled.disconnect, self._settled)
        for worker in set(self.workers.values()):
            worker.record_metrics(True)
            self._on.callback(worker.record_metrics, False)
        return self

    def stop(self) -> None:
        self._on.close()

    def __enter__(self) -> InProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- time ---------------------------------------------------------------------------------------

    def run_until(self, until: datetime) -> None:
        """Handle what is due now, then let time pass until ``until`` (see :meth:`VirtualClock.advance`)."""
        with self._loop():
            self._run_due()
            while (due := self.broker.next_expiry()) is not None and due <= until:
                self.clock.move_to(due)
                self.broker.expire()
                self._run_due()
            self.clock.move_to(until)

    def drain(self, within: float | None = None) -> float:
        """Let time pass until no message waits anywhere, handling everything; returns the seconds that passed.

        With ``within`` seconds, fail (``AssertionError``) if messages would still wait after that long.
        """
        started = self.clock.now()
        with self._loop():
            self._run_due()
            while (due := self.broker.next_expiry(dead_lettering_only=True)) is not None:
                if within is not None and (due - started).total_seconds() > within:
                    raise AssertionError(f"messages still wait after {within:g}s: {self.waiting()}")
                self.clock.move_to(due)
                self.broker.expire()
                self._run_due()
        return (self.clock.now() - started).total_seconds()

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
            taken = self.broker.oldest(list(self.workers))
            if taken is None:
                return
            queue, envelope = taken
            self.workers[queue].consume(queue, envelope)
        raise RuntimeError(
            f"{MAX_RUNS_AT_ONCE} messages handled at {self.clock.now()} without time passing: "
            "do handlers fire the events they handle?"
        )

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
        return Archive(self.apps[service])

    def waiting(self) -> list[Waiting]:
        """Messages not handled yet, oldest first: in services' queues, or waiting out a delay."""
        found = []
        for queue in self.broker.queues.values():
            ladder = queue.name.startswith(delays.PREFIX + ".delay.")
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
        self.transport.publish(OutgoingMessage("", queue, headers, body, message_id, content_type, content_encoding))

    def relay_outbox(self, app: EventsApp, engine: Any = None) -> int:
        """Publish ``app``'s committed outbox rows with the relay's own code, then handle what is due.

        The rows are read from ``engine`` (default: the app's ``outbox_url``).
        While the in-process mode is on, the in-process relay thread does not
        start: tests call this instead. Returns how many rows were published.
        """
        from amqp_events.outbox.relay import Relay

        relay = Relay(app, app.outbox_store(engine=engine))
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
        elif not message.exchange:
            return  # a copy for one queue: a retry, an archived or a replayed message
        if cloud_events.is_cloud_event(envelope.headers, envelope.content_type):
            try:
                event = cloud_events.read(envelope.headers, envelope.body, envelope.content_type)
            except cloud_events.Unreadable:
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

    def _settled(self, sender: Any, delivery: Delivery, outcome: Outcome, handling: Handling, **_: Any) -> None:
        self.runs.append(
            Run(
                service=handling.service,
                handler=handling.handler,
                event=delivery.event,
                event_id=delivery.event_id,
                attempt=delivery.retries + 1,
                outcome=outcome.kind,
                args=tuple(delivery.args),
                kwargs=dict(delivery.kwargs),
                at=self.clock.now(),
                delay=outcome.delay if isinstance(outcome, Redeliver) else None,
                reason=str(outcome.reason) if isinstance(outcome, Archived) else None,
                error=getattr(outcome, "error", None),
            )
        )


class InProcessTransport:
    """Every app's transport while the in-process mode is on: the broker in memory."""

    def __init__(self, mode: InProcess) -> None:
        self.mode, self.broker = mode, mode.broker

    def publish(self, message: OutgoingMessage) -> bool:
        routed = self.route(message)
        self.mode.run_due()
        return routed

    def route(self, message: OutgoingMessage) -> bool:
        """Put ``message`` where the broker would, without handling anything yet."""
        envelope = envelope_of(message)
        exchange = exchange_to_declare(message)
        if exchange is not None:
            self.broker.declare_exchange(exchange)
        try:
            routed = self.broker.publish(envelope)
        except QueueFull as exc:
            raise PublishError(f"the broker refused {message.event!r} (nack): {exc}") from exc
        self.mode.published(message, envelope, routed)
        return routed

    def batch(self, window: int) -> InProcessBatch:
        return InProcessBatch(self)

    def declare(self, topology: Topology) -> None:
        self.broker.declare(topology)

    def browse(self, queue: str) -> Any:
        return self.broker.browse(queue)

    def count(self, queue: str) -> int:
        return self.broker.count(queue)

    def close(self) -> None:
        pass


class InProcessBatch:
    """A batch: messages are routed as they are published; handlers run when the batch waits (its end)."""

    def __init__(self, transport: InProcessTransport) -> None:
        self.transport = transport
        self.confirmed: list[Any] = []
        self.returned: set[str] = set()

    def publish(self, message: OutgoingMessage, key: Any = None) -> None:
        if not self.transport.route(message):
            self.returned.add(message.message_id)
        self.confirmed.append(message.message_id if key is None else key)

    def wait(self) -> None:
        self.transport.mode.run_due()

    def results(self) -> tuple[list[Any], list[Any], set[str]]:
        results: tuple[list[Any], list[Any], set[str]] = (self.confirmed, [], self.returned)
        self.confirmed, self.returned = [], set()
        return results

    def close(self) -> None:
        pass


def envelope_of(message: OutgoingMessage) -> Envelope:
    """``message`` as it reaches the broker: its body serialised by kombu exactly as a producer does."""
    if message.content_type is None:
        content_type, content_encoding, body = dumps(message.body, serializer="json")
    else:
        content_type, content_encoding, body = message.content_type, message.content_encoding, message.body
    if isinstance(body, str):
        body = body.encode(content_encoding or "utf-8")
    properties = {
        "message_id": message.message_id,
        "delivery_mode": 2,
        "content_type": content_type,
        "content_encoding": content_encoding,
    }
    return Envelope(
        dict(message.headers), body, content_type, content_encoding, properties, message.exchange, message.routing_key
    )


def in_process(
    *apps: EventsApp, unhandled: Literal["raise", "ignore"] = "raise", start: datetime | None = None
) -> InProcess:
    """The in-process mode for these services' apps; use it as a context manager (or ``start()``/``stop()``).

    ``unhandled="raise"`` (the default) makes firing an event no service of
    the test handles an :class:`UnhandledEvent` error. ``start`` is where
    the virtual clock starts (default: now).
    """
    return InProcess(apps, unhandled=unhandled, start=start)
