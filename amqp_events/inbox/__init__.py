"""Exactly-once effects: a handler's effect happens once per service, although delivery is at least once.

Two forms, both keyed by ``(service, handler, event id)``:

* :class:`Inbox` (the strong form), for effects that are database writes:
  ``@app.handler(..., inbox=Inbox(sessions))`` runs the handler in a
  transaction of that database, hands it the session (or connection), and
  inserts the key into the inbox table *first*, in that same transaction.
  The handler's writes and the key commit together or not at all. A
  duplicate finds the key and is skipped (acked); a concurrent duplicate
  waits on the first one's row lock (pessimistic) and is skipped once it
  commits, or runs if the first one rolled back.
* :class:`RedisDedup` and :class:`SqlDedup` (the weak form), for effects
  outside the database (an e-mail, an HTTP call): consulted before the
  handler runs, recorded after it succeeded. A crash between the effect and
  the record, or two duplicates running at the same moment, can still repeat
  the effect.
"""

from typing import Any

from amqp_events.inbox.base import DedupStore, EffectKey, TransactionalInbox
from amqp_events.inbox.redis import RedisDedup

__all__ = ["DedupStore", "EffectKey", "Inbox", "RedisDedup", "SqlDedup", "TransactionalInbox"]


def __getattr__(name: str) -> Any:
    # The SQL forms need the [sqlalchemy] extra: imported on first use, so that workers without it still load.
    if name in ("Inbox", "SqlDedup"):
        from amqp_events.inbox import sql

        return getattr(sql, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
