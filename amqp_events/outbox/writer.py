"""Firing inside ``with app.outbox(...)``: events become rows of the application's own transaction.

A target is the application's database handle, in the transaction its
business writes use:

* a SQLAlchemy ORM ``Session`` or a Core ``Connection`` (2.x);
* a Django database connection (``django.db.connection``, or ``connections[alias]``).

The event is validated and built exactly as when it is published; then its
row is inserted on that handle, so it commits or rolls back with the rest.
Inside ``with app.batch():`` the rows are inserted together when the batch
ends (one ``executemany``). After the transaction commits, the app's
in-process relay (when enabled) is woken.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from amqp_events.core.context import Firing
from amqp_events.core.firing import fired
from amqp_events.outbox.store import row_values

if TYPE_CHECKING:
    from amqp_events.outbox.relay import RelayThread
    from amqp_events.outbox.targets import Target


class OutboxWriter:
    """Where a service's events go while ``with app.outbox(target):`` is open (a sink of
    :mod:`amqp_events.core.firing`); ``relay``, if any, is woken after the transaction commits."""

    def __init__(self, service: str, target: Target, relay: RelayThread | None) -> None:
        self.service, self.target, self.relay = service, target, relay
        #: Rows waiting for the end of ``with app.batch():``.
        self._buffer: list[dict[str, Any]] | None = None
        self._wake_pending = False
        #: Ids of the events written in the current batch, in order.
        self.ids: list[str] = []

    def take(self, firing: Firing) -> None:
        """Store the fired message (published after its delay) in the application's transaction."""
        message, delay = firing.message, firing.delay
        now = time.time()
        row = row_values(message, self.service, now, now + delay if delay else None)
        if self._buffer is not None:
            self._buffer.append(row)
            self.ids.append(message.message_id)
        else:
            self.target.insert([row])
        fired(firing, "outbox")
        self._wake_relay_after_commit(firing)

    @contextmanager
    def batch(self) -> Iterator[OutboxWriter]:
        """Collect the rows of a batch and insert them together when it ends (and only if it ends well)."""
        if self._buffer is not None:  # inside a block that collects already: join it
            yield self
            return
        with self.collecting() as rows:
            yield self
            if rows:
                self.target.insert(rows)

    @contextmanager
    def collecting(self) -> Iterator[list[dict[str, Any]]]:
        """Inside the block, rows are collected instead of inserted; the caller inserts what it yields."""
        self._buffer, self.ids = [], []
        try:
            yield self._buffer
        finally:
            self._buffer = None

    def _wake_relay_after_commit(self, firing: Firing) -> None:
        relay = self.relay
        if relay is None or self._wake_pending:
            return
        relay.use(self.target, firing.context)
        self._wake_pending = True

        def wake() -> None:
            self._wake_pending = False
            relay.wake()

        self.target.after_commit(wake)
