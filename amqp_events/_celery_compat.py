"""Every place the library adjusts an internal of Celery, kombu or billiard, and why.

Everything else uses public APIs (tasks, bootsteps, signals, kombu entities).
Each adjustment below names the upstream behaviour it changes and is
covered by a test that fails when upstream stops calling it
(``tests/test_celery_compat.py``, and the broker tests named there).

Checked against Celery 5.5.3, 5.6.3 and 5.7.0 (kombu 5.5.4, 5.6.2 and 5.7.0,
billiard 4.3.2, py-amqp 5.4.2): CI runs the broker suite on the oldest and
the newest of these lines.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery import Celery, signals
from celery.app.amqp import AMQP, Queues
from celery.app.utils import Settings as CelerySettings
from celery.concurrency.solo import TaskPool as SoloPool
from celery.worker.consumer import Consumer
from celery.worker.request import Request
from celery.worker.state import task_ready
from kombu.exceptions import ContentDisallowed
from kombu.message import Message
from kombu.utils.objects import cached_property
from vine import promise

from amqp_events import worker
from amqp_events.errors import SettingsFrozen
from amqp_events.handler import delivery_of
from amqp_events.message import Reason
from amqp_events.settings import SETTING_PREFIX, raw_settings

if TYPE_CHECKING:
    from amqp_events.app import EventsApp
    from amqp_events.handler import EventHandler

logger = logging.getLogger(__name__)


# -- the queues a worker consumes ---------------------------------------------------------------------


class EventQueues(Queues):  # type: ignore[misc]
    """Celery's queue table of a worker, kept in step with the service's handlers.

    Upstream: ``WorkController.setup_instance`` reads ``app.amqp.queues``
    (``setup_queues``) *before* it imports the modules named by
    ``celery worker --include`` (``setup_includes``), and the table is
    cached. A handler registered afterwards would never be consumed, so the
    event queues are added again whenever Celery asks which queues to
    consume, or looks up a queue by name (``-Q``).
    """

    app: EventsApp

    @property
    def consume_from(self) -> Mapping[str, Any]:
        self.add_event_queues()
        return super().consume_from  # type: ignore[no-any-return]

    def __missing__(self, name: str) -> Any:
        self.add_event_queues()
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        return super().__missing__(name)

    def add_event_queues(self) -> None:
        # Without -Q a worker consumes every queue of the table: the table itself (5.5), or a copy of it
        # made when it was built (5.6+), which needs the new queue too.
        consumed_by_default = getattr(self, "_default_consume_from", None) if self._consume_from is None else None
        for queue in self.app.topology.event_queues:
            if not dict.__contains__(self, queue.name):
                # The worker declares its topology on every connection, before consuming (worker.on_connected),
                # keeping a queue an earlier version made without the replica-placement arguments: Celery's own
                # declaration, with every argument, would then be refused.
                queue.no_declare = True  # type: ignore[attr-defined]  # kombu's attribute, untyped
                self[queue.name] = queue
                if consumed_by_default is not None:
                    consumed_by_default[queue.name] = queue


class EventsAMQP(AMQP):  # type: ignore[misc]
    """Celery's AMQP helper of an events app: its queues are the service's event queues (and ``task_queues``).

    Upstream: ``AMQP.queues`` builds the table from ``task_queues``, adding
    Celery's default ``celery`` queue when it is empty; a worker of a
    service would then consume ``celery`` instead of its event queues.
    """

    @cached_property
    def queues(self) -> EventQueues:
        app = self.app
        conf = app.conf
        table = EventQueues(
            conf.task_queues or (),
            default_exchange=self.default_exchange,
            create_missing=conf.task_create_missing_queues,
            autoexchange=self.autoexchange,
            max_priority=conf.task_queue_max_priority,
            default_routing_key=conf.task_default_routing_key,
        )
        table.app = app
        table.add_event_queues()
        return table


# -- the consumer -------------------------------------------------------------------------------------


class EventConsumer(Consumer):  # type: ignore[misc]
    """Celery's task consumer for an events app (``worker_consumer``, set by ``events_app``)."""

    app: EventsApp
    hub: Any

    class Blueprint(Consumer.Blueprint):  # type: ignore[misc]
        # Upstream (5.5+): the DelayedDelivery step declares 28 queues of its own on every vhost with quorum
        # queues and binds ours to them. Delays here go through the library's ladder, routed to one queue.
        default_steps: ClassVar[list[str]] = [
            step for step in Consumer.Blueprint.default_steps if not step.endswith(":DelayedDelivery")
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.archiver = worker.Archiver(self.app, self.timer)
        self.waker = LoopWaker(self.hub) if self.hub is not None else None
        signals.worker_shutting_down.connect(self.wake_event_loop)  # weak: goes with the consumer

    def wake_event_loop(self, **_: Any) -> None:
        """Upstream: a warm shutdown only sets a flag the event loop reads between polls, and a poll lasts
        up to 10 s when nothing arrives; kombu < 5.7 has no way to wake it from a signal handler."""
        if self.waker is not None:
            self.waker.wake()

    def shutdown(self) -> None:
        signals.worker_shutting_down.disconnect(self.wake_event_loop)
        if self.waker is not None:
            self.waker.close()
            self.waker = None
        super().shutdown()

    def connect(self) -> Any:
        connection = super().connect()
        worker.on_connected(self.app, connection, self.app.amqp.queues.consume_from)
        return connection

    def create_task_handler(self, promise: Callable[..., Any] = promise) -> Callable[[Message], Any]:
        if isinstance(self.pool, SoloPool):
            promise = acks_now(promise, deferred=(self.call_soon, getattr(self, "call_soon_ack", None)))
        run = super().create_task_handler(promise)

        def on_task_received(message: Message) -> Any:
            # Upstream decodes the body later, in code that crashes the consumer on a body of the wrong
            # shape (e.g. a JSON string), and drops or rejects what it cannot run: check first, and archive.
            # A CloudEvent is read into a task message here, before upstream looks at its headers.
            refused = worker.admit(message, self.app)
            if refused is not None:
                return self.archiver.archive(message, *refused)
            return run(message)

        return on_task_received

    # Upstream's hooks for messages it cannot run, should one reach them after all (a handler registered
    # after the consumer started): it acks and drops undecodable ones, and rejects unknown tasks (which the
    # queue's dead-letter exchange would bring straight back). Each is archived instead.

    def on_decode_error(self, message: Message, exc: Exception) -> None:
        self.archiver.archive(message, Reason.UNDECODABLE, exc)

    def on_unknown_message(self, body: Any, message: Message) -> None:
        self.archiver.archive(message, Reason.UNDECODABLE, worker.not_an_event())

    def on_unknown_task(self, body: Any, message: Message, exc: Exception) -> None:
        name = (message.headers or {}).get("task")
        self.archiver.archive(message, Reason.UNKNOWN_EVENT, worker.unknown_event(self.app.service, name))

    def on_invalid_task(self, body: Any, message: Message, exc: Exception) -> None:
        reason = Reason.FORBIDDEN_CONTENT_TYPE if isinstance(exc, ContentDisallowed) else Reason.UNDECODABLE
        self.archiver.archive(message, reason, exc)


def acks_now(make_promise: Callable[..., Any], deferred: Iterable[Any]) -> Callable[..., Any]:
    """A ``promise`` factory for ``Consumer.create_task_handler`` whose ack/reject callbacks run at once.

    Upstream: the task handler wraps ``message.ack``/``reject`` in promises of
    ``Consumer.call_soon`` (5.5, 5.6) or ``call_soon_ack`` (5.7), which queue
    them for the event loop's next turn. With the solo pool the task ran inside
    this turn, and the next one may first sit in ``poll()`` for up to 10 s: once
    the prefetch window is full the broker sends nothing to wake it. The solo
    pool runs on the loop's own thread, so the ack can be sent right away.
    """
    later = {callback for callback in deferred if callback is not None}

    def make(fun: Any = None, args: Any = None, *rest: Any, **options: Any) -> Any:
        return make_promise(call_now if fun in later else fun, args, *rest, **options)

    return make


def call_now(callback: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        callback(*args, **kwargs)
    except Exception:
        logger.exception("could not ack or reject a message")


class LoopWaker:
    """A pipe in the worker's event loop: writing to it ends the loop's current poll at once."""

    def __init__(self, hub: Any) -> None:
        self.hub = hub
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        hub.add_reader(self.read_fd, self._drain)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe has a wake-up pending already
            os.write(self.write_fd, b"\0")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.hub.remove_reader(self.read_fd)
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            os.read(self.read_fd, 4096)


# -- lost pool processes ------------------------------------------------------------------------------


class EventRequest(Request):  # type: ignore[misc]
    """Celery's worker-side request for a handler's message, counting pool processes lost exactly.

    Upstream: when the pool process running a message dies, ``on_failure``
    gets a ``WorkerLostError`` (5.7 also turns a ``SystemExit`` or
    ``KeyboardInterrupt`` the process reported before it ended into one;
    5.5 and 5.6 fail the task with it) and requeues the message
    (``task_reject_on_worker_lost``); the broker would then count every
    return alike, also those of messages a dying worker had only prefetched.
    The main process knows which message its lost child was running, so it
    decides that one: run again, or archive after
    ``amqp_events_max_deliveries`` losses; then ack.
    """

    task: EventHandler

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        if not self._lost_its_process(exc_info.exception):
            return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)
        task_ready(self)
        handler = self.task
        try:
            handler.after_lost_process(delivery_of(self, handler.queue_name))
        except Exception:
            logger.exception("could not handle the loss of the process running %s; requeueing it", self.id)
            self.reject(requeue=True)
            return None
        self.acknowledge()
        return None

    def _lost_its_process(self, exc: BaseException) -> bool:
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if not self.task.acks_late:
            return False
        if isinstance(exc, WorkerLostError):
            return True
        # The process ended the run itself; unless this worker killed it (revoked, cancelled), it is lost.
        return isinstance(exc, (SystemExit, KeyboardInterrupt)) and not (
            self._already_cancelled or self._already_revoked
        )


# -- settings read once -------------------------------------------------------------------------------


class GuardedSettings(CelerySettings):  # type: ignore[misc]
    """Celery's ``app.conf``, refusing changes to ``amqp_events_*`` settings once the library read them.

    Upstream: ``app.conf`` is a ``celery.app.utils.Settings`` whose changes go
    through these methods (attribute writes included); ``config_from_object``
    builds a new one, checked by :meth:`amqp_events.app.EventsApp._load_config`.
    """

    def __setitem__(self, key: str, value: Any) -> None:
        self.refuse_changes({key: value})
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> Any:
        self.refuse_changes(dict(*args, **kwargs))
        return super().update(*args, **kwargs)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self.refuse_changes({key: default})
        return super().setdefault(key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self.refuse_changes({key: None})
        return super().pop(key, *default)

    def __delitem__(self, key: str) -> None:
        self.refuse_changes({key: None})
        super().__delitem__(key)

    def refuse_changes(self, changes: Mapping[str, Any]) -> None:
        frozen = self.__dict__.get("amqp_events_frozen")
        if frozen is None:
            return
        values, read_at = frozen
        changed = sorted(
            key for key, value in changes.items() if str(key).startswith(SETTING_PREFIX) and values.get(key) != value
        )
        if changed:
            raise SettingsFrozen(
                f"{', '.join(changed)} cannot change now: the app read its amqp_events_* settings {read_at}. "
                "Set them before that: in events_app(...), or in the configuration loaded when the app is made."
            )


def freeze(conf: Any, values: Mapping[str, Any], read_at: str) -> None:
    """From now on, changing any of ``values`` (the ``amqp_events_*`` settings as read) on ``conf`` raises."""
    if not isinstance(conf, GuardedSettings):
        object.__setattr__(conf, "__class__", GuardedSettings)  # its own __setattr__ would store a setting
    conf.__dict__["amqp_events_frozen"] = (dict(values), read_at)


class EventsCelery(Celery):  # type: ignore[misc]
    """The Celery app class an events app is made of, with its two adjustments."""

    #: Upstream: ``app.amqp`` is built from ``amqp_cls`` (see :class:`EventsAMQP`).
    amqp_cls = f"{__name__}:EventsAMQP"
    _frozen: tuple[dict[str, Any], str] | None = None

    def freeze_settings(self, values: Mapping[str, Any], read_at: str) -> None:
        """Refuse later changes to ``values``, the ``amqp_events_*`` settings as they were read."""
        self._frozen = (dict(values), read_at)
        freeze(self.conf, values, read_at)

    def _load_config(self) -> Any:
        # Upstream: a configuration loaded after the app was configured (config_from_object) replaces
        # app.conf with a new object. Keep guarding it, and refuse it if it changes settings already read.
        conf = super()._load_config()
        if self._frozen is not None:
            freeze(conf, *self._frozen)
            conf.refuse_changes(raw_settings(conf))
        return conf
