"""The relay: publishes committed outbox rows with broker confirms, then deletes them.

A relay claims up to ``amqp_events_outbox_batch`` pending rows for a lease
(``amqp_events_outbox_lease`` seconds), publishes them with pipelined
confirms in row order, deletes the confirmed ones and gives the others back:

* the broker unreachable: rows are released untouched and the relay waits,
  0.5 s doubling to 30 s, until the broker is back; the backlog then drains;
* a row the broker refuses (nack), or a delayed one whose delay queue is
  missing: its attempt is counted and it waits 5 s before being tried again;
* a row that can never be published (unreadable, or refused as too large by
  the broker): dead at once, with the reason; also after
  ``amqp_events_outbox_max_attempts`` failed attempts. Dead rows stay until
  ``amqp-events outbox retry|purge``.

Several relays may share a PostgreSQL outbox: claims skip locked rows, and a
relay that died mid-batch leaves its rows to the others once its lease
expires (rows it had published but not yet deleted are then published again:
a duplicate, never a loss). Relays there wait for ``LISTEN``; elsewhere they
poll every ``amqp_events_outbox_poll_interval`` seconds, or are woken by the
application after a commit (the in-process relay). SQLite has one relay at a
time: a second one is refused while the first holds the database's lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from amqp_events.core.context import ServiceContext
from amqp_events.errors import MessageRefused, RelayConflict
from amqp_events.metrics import OutboxMetrics
from amqp_events.outbox.store import OutboxRow, OutboxStore
from amqp_events.topology import delays
from amqp_events.transport.base import BatchPublisher
from amqp_events.wire.message import OutgoingMessage

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from amqp_events.outbox.targets import Target

logger = logging.getLogger(__name__)

#: Pauses while the broker is unreachable: doubling from the first to the last.
FIRST_PAUSE, MAX_PAUSE = 0.5, 30.0
#: After a wake-up that found nothing, look again after these pauses: the wake-up of a Core connection
#: comes just before its commit, which may take a few milliseconds more.
RECHECKS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
#: Seconds between updates of the relays table and of the pending-rows metrics.
STATS_INTERVAL = 5.0


class BrokerUnavailable(Exception):
    """The broker could not be reached, or the connection failed during a batch."""


class Relay:
    """Publishes the rows of one outbox; :meth:`run` until :meth:`stop`."""

    def __init__(
        self,
        context: ServiceContext,
        store: OutboxStore,
        *,
        batch_size: int | None = None,
        lease: float | None = None,
        poll_interval: float | None = None,
        name: str | None = None,
    ) -> None:
        settings = context.settings
        self.context, self.store = context, store
        self.batch_size = batch_size or settings.outbox_batch
        self.lease = lease or settings.outbox_lease
        self.poll_interval = poll_interval or settings.outbox_poll_interval
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.metrics = OutboxMetrics(store.tables.rows.name)
        self.published = 0
        #: Set by :meth:`stop`.
        self.stopping = threading.Event()
        self._woken = threading.Event()
        self._publisher: BatchPublisher | None = None
        self._listener: PostgresListener | None = None
        self._lock: SqliteLock | None = None
        self._broker_errors = context.transport.errors

    # -- running ------------------------------------------------------------------------------------

    def run(self, on_progress: Callable[[Relay], None] | None = None) -> None:
        """Relay until :meth:`stop`; raises :class:`RelayConflict` if another relay holds a SQLite outbox."""
        self._lock = SqliteLock.of(self.store)
        started, stats_due = time.time(), 0.0
        pause = FIRST_PAUSE
        logger.info("outbox relay %s started on %s", self.name, self.store.engine.url.render_as_string())
        try:
            self._listener = PostgresListener.of(self.store)
            while not self.stopping.is_set():
                if time.monotonic() >= stats_due:
                    self._report(started)
                    stats_due = time.monotonic() + STATS_INTERVAL
                    if on_progress:
                        on_progress(self)
                try:
                    relayed = self.run_once()
                except BrokerUnavailable as exc:
                    logger.warning(
                        "outbox relay %s: broker unavailable (%s); trying again in %.1fs", self.name, exc, pause
                    )
                    self.stopping.wait(pause)
                    pause = min(pause * 2, MAX_PAUSE)
                    continue
                pause = FIRST_PAUSE
                if not relayed:
                    self._wait()
        finally:
            self._close()

    def stop(self) -> None:
        self.stopping.set()
        self._woken.set()

    def wake(self) -> None:
        """A transaction that wrote rows committed: look now instead of at the next poll."""
        self._woken.set()

    def run_once(self) -> int:
        """Claim, publish and settle one batch; returns how many rows it claimed."""
        rows = self.store.claim(self.name, self.batch_size, self.lease)
        if rows:
            self.publish(rows)
        return len(rows)

    # -- one batch ----------------------------------------------------------------------------------

    def publish(self, rows: list[OutboxRow]) -> None:
        """Publish claimed ``rows``, then delete the confirmed ones and settle the others."""
        errors: dict[int, str] = {}
        permanent: set[int] = set()
        messages: dict[int, OutgoingMessage] = {}
        for row in rows:
            try:
                messages[row.id] = self._message(row)
            except (ValueError, TypeError) as exc:
                errors[row.id] = f"cannot be read back: {exc}"
                permanent.add(row.id)
        try:
            confirmed, refused, returned = self._publish_pipelined(messages)
        except BrokerUnavailable:
            self.store.release(self.name, messages)
            self._settle(rows, [], errors, permanent)
            raise
        except MessageRefused as exc:  # one message closed the channel: find which, one at a time
            logger.warning("outbox relay %s: the broker closed the channel (%s); publishing one by one", self.name, exc)
            confirmed, refused, returned = self._publish_one_by_one(messages, errors, permanent)
        for row_id in refused:
            errors[row_id] = "the broker refused it (nack)"
        for row_id in returned:
            if messages[row_id].delayed:
                errors[row_id] = "no delay queue received it: start a worker or run `amqp-events topology declare`"
        self._settle(rows, [row_id for row_id in confirmed if row_id not in errors], errors, permanent)

    def _message(self, row: OutboxRow) -> OutgoingMessage:
        message = row.message()
        remaining = (row.due_at or 0) - time.time()
        if remaining <= 0:
            return message
        destination = delays.event_destination(row.routing_key)
        return message.after(delays.whole_seconds(remaining), destination, self.context.now())

    def _publish_pipelined(self, messages: dict[int, OutgoingMessage]) -> tuple[list[int], list[int], set[int]]:
        """Publish with confirms in flight together; ``(confirmed, refused, returned)`` row ids."""
        try:
            publisher = self._batch_publisher()
            for row_id, message in messages.items():
                publisher.publish(message, key=row_id)
            publisher.wait()
        except MessageRefused:
            self._drop_publisher()
            raise
        except self._broker_errors as exc:
            self._drop_publisher()
            raise BrokerUnavailable(str(exc)) from exc
        confirmed, refused, returned_ids = publisher.results()
        returned = {row_id for row_id, message in messages.items() if message.message_id in returned_ids}
        return confirmed, refused, returned

    def _publish_one_by_one(
        self, messages: dict[int, OutgoingMessage], errors: dict[int, str], permanent: set[int]
    ) -> tuple[list[int], list[int], set[int]]:
        confirmed: list[int] = []
        refused: list[int] = []
        returned: set[int] = set()
        for row_id, message in messages.items():
            try:
                done, nacked, unrouted = self._publish_pipelined({row_id: message})
            except MessageRefused as exc:
                errors[row_id] = str(exc)
                if exc.permanent:  # e.g. larger than the broker's max_message_size
                    permanent.add(row_id)
                continue
            confirmed += done
            refused += nacked
            returned |= unrouted
        return confirmed, refused, returned

    def _batch_publisher(self) -> BatchPublisher:
        if self._publisher is None:
            try:
                self._publisher = self.context.transport.batch(self.batch_size)
            except self._broker_errors as exc:
                raise BrokerUnavailable(str(exc)) from exc
        return self._publisher

    def _drop_publisher(self) -> None:
        if self._publisher is not None:
            with contextlib.suppress(Exception):
                self._publisher.close()
            self._publisher = None

    # -- waiting, reporting -------------------------------------------------------------------------

    def _wait(self) -> None:
        if self._listener is not None:
            self._listener.wait(min(self.poll_interval, 1.0))  # stop() is noticed within a second
            return
        if not self._woken.wait(self.poll_interval):
            return
        self._woken.clear()
        for pause in RECHECKS:  # a writer's commit may land a moment after its wake-up call
            if self.stopping.is_set() or self.run_once():
                return
            time.sleep(pause)

    def _report(self, started: float) -> None:
        self.store.heartbeat(self.name, started)
        stats = self.store.stats()
        self.metrics.pending(stats.pending, stats.oldest_age(time.time()), stats.dead)

    def _settle(self, rows: list[OutboxRow], done: list[int], errors: dict[int, str], permanent: set[int]) -> None:
        """Delete the published rows, count the failed ones (dead when permanent); record and log both."""
        self.store.published(self.name, done)
        if errors:
            self.store.failed(self.name, errors, permanent)
        published = set(done)
        for row in rows:
            if row.id in published:
                self.metrics.published(row.service)
            elif row.id in errors:
                self.metrics.failed(row.service, "dead" if row.id in permanent else "retry")
                logger.warning("outbox row %s (event %s %s): %s", row.id, row.event, row.event_id, errors[row.id])
        self.published += len(done)

    def _close(self) -> None:
        self._drop_publisher()
        with contextlib.suppress(Exception):
            self.store.forget(self.name)
        if self._listener is not None:
            self._listener.close()
        if self._lock is not None:
            self._lock.release()
        logger.info("outbox relay %s stopped after publishing %d event(s)", self.name, self.published)


class PostgresListener:
    """``LISTEN`` on the outbox's channel, on a connection of its own (psycopg 3)."""

    def __init__(self, engine: Engine, channel: str) -> None:
        self.raw = engine.raw_connection()
        connection: Any = self.raw.driver_connection
        connection.autocommit = True
        connection.execute(f'LISTEN "{channel}"')
        self.connection = connection

    @classmethod
    def of(cls, store: OutboxStore) -> PostgresListener | None:
        if not store.is_postgresql or store.engine.dialect.driver != "psycopg":
            return None  # other drivers poll
        return cls(store.engine, store.tables.notify_channel)

    def wait(self, timeout: float) -> bool:
        """Until a transaction that inserted rows commits (``True``), or ``timeout`` seconds."""
        return any(True for _ in self.connection.notifies(timeout=timeout, stop_after=1))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.raw.invalidate()  # LISTEN must not go back into the pool


class SqliteLock:
    """The one-relay-at-a-time lock of a SQLite outbox: a lock file beside the database, held while relaying.

    The operating system releases it when the process ends, however it ends.
    """

    def __init__(self, database: str) -> None:
        self.path = f"{database}.relay-lock"
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            raise RelayConflict(
                f"another relay (pid {holder}) already relays the SQLite outbox {database}; SQLite has one relay "
                "at a time (PostgreSQL takes several)"
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    @classmethod
    def of(cls, store: OutboxStore) -> SqliteLock | None:
        database = store.engine.url.database
        if store.engine.dialect.name != "sqlite" or not database or database == ":memory:":
            return None
        return cls(database)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


class RelayThread:
    """The in-process relay of an app (``amqp_events_outbox_relay``): a daemon thread, started on first use.

    It reads the database the first outbox write used (or
    ``amqp_events_outbox_url``: ``store(None)``) and is woken after each
    commit. In a forked child (a prefork pool, a web server's workers) it
    starts again on first use. On a SQLite outbox held by another relay it
    waits as a standby.
    """

    STANDBY = 10.0

    def __init__(self, service: str, store: Callable[[Engine | None], OutboxStore], url_given: bool) -> None:
        self.service, self.store, self.url_given = service, store, url_given
        self.relay: Relay | None = None
        self._pid = 0
        self._guard = threading.Lock()

    def use(self, target: Target, context: ServiceContext) -> None:
        """Make sure the relay runs in this process (on ``target``'s database when no URL is set)."""
        if self._pid == os.getpid():
            return
        with self._guard:
            if self._pid == os.getpid():
                return
            store = self.store(None if self.url_given else target.engine())
            self.relay = Relay(context, store)
            threading.Thread(target=self._run, name=f"amqp-events-outbox-relay-{self.service}", daemon=True).start()
            self._pid = os.getpid()

    def wake(self) -> None:
        if self.relay is not None and self._pid == os.getpid():
            self.relay.wake()

    def stop(self) -> None:
        if self.relay is not None and self._pid == os.getpid():
            self.relay.stop()

    def _run(self) -> None:
        relay = self.relay
        assert relay is not None
        while not relay.stopping.is_set():
            try:
                relay.run()
                return
            except RelayConflict as exc:
                logger.info("in-process outbox relay on standby: %s", exc)
            except Exception:
                logger.exception("in-process outbox relay failed; starting it again")
            relay.stopping.wait(self.STANDBY)
