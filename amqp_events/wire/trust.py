"""What a receiver may believe of a message: only what the broker verified, and what it wrote itself.

RabbitMQ checks one property of every message: a ``user_id`` must be the user of the connection that published
it (anything else is refused, 406). The library sets it on every publish, so a receiver knows which user sent a
message. Everything else is the sender's say: a header can claim any author, name any handler, carry any count.

* A message its own user sent (or a user it trusts: an administrator's console) is **its own copy**: a retry, a
  replay, an event it fired itself. Its headers are the service's own writing and are believed.
* Any other message is **a sender's**: its author is the service its user stands for (by name, or through
  ``amqp_events_service_users``), never its ``fired_by`` header; the headers only the service's own copies carry
  (the handler a copy is for, retry and loss counts, replay and partition commands) are dropped, and its count
  of retries starts at 0.
* A service whose own user stands for no service (a user shared in development, ``guest``), or is not known
  (a certificate login), can tell nobody apart: every author is ``None``.

:func:`vouch` applies this to a message's headers, once, where it enters a worker and wherever the service makes
a copy of a stored message (an archive replay, a history replay), so that every copy carries the verified author.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from amqp_events.wire.archive_headers import REPLAY_TRACEPARENT
from amqp_events.wire.batch import REPLAY_BATCH
from amqp_events.wire.message import (
    DEATH_HEADERS,
    DUE_AT,
    EVENT_KEY,
    FAILED_SECTION,
    FIRED_AS,
    FIRED_BY,
    FIRST_FAILURE_AT,
    FOR_HANDLER,
    LOST_RUNS,
    SECTION_RETRIES,
)
from amqp_events.wire.parked import HISTORY_REPLAY, PARKING_HEADERS

#: Headers only the service's own copies carry: what they say steers which handler runs, how often, and the
#: ordered handlers' partitions. A sender's message loses them.
OWN_COPIES_ONLY = (
    FOR_HANDLER,
    FIRED_AS,
    LOST_RUNS,
    SECTION_RETRIES,
    FAILED_SECTION,
    FIRST_FAILURE_AT,
    DUE_AT,
    REPLAY_TRACEPARENT,
    REPLAY_BATCH,
    HISTORY_REPLAY,
    "replayed_by",
    "replay_of",
    *PARKING_HEADERS,
)


#: Headers of Celery's protocol that steer how a worker runs a task (its time limits, the name it logs, what its
#: events and logs show of the arguments, revocation by stamp, a group's result): the receiver decides these
#: itself, so they are removed from every message where it enters (the library never writes them).
RECEIVER_DECIDES = (
    "timelimit",
    "shadow",
    "argsrepr",
    "kwargsrepr",
    "ignore_result",
    "stamped_headers",
    "stamps",
    "replaced_task_nesting",
    "group",
    "group_index",
)


def drop_unverified(headers: dict[str, Any], dead_lettered: bool) -> None:
    """Remove from ``headers``, where a message enters, what its sender may not say: :data:`RECEIVER_DECIDES`,
    and RabbitMQ's dead-lettering history unless the message came back by the broker's dead-lettering
    (``dead_lettered``: through the service's dead-letter exchange, which no one else may publish to)."""
    for name in RECEIVER_DECIDES:
        headers.pop(name, None)
    if not dead_lettered:
        for name in DEATH_HEADERS:
            headers.pop(name, None)


@dataclass(frozen=True)
class Identity:
    """Who a service is on its broker: its name, the user it connects as, and how users map to services."""

    service: str
    #: The RabbitMQ user this process connects as (``None``: not known, such as with certificate logins).
    user: str | None
    #: Users whose name is not their service's (``amqp_events_service_users``).
    users: Mapping[str, str] = field(default_factory=dict)
    #: Other users whose copies the service takes as its own (``amqp_events_trusted_users``).
    trusted: frozenset[str] = frozenset()

    def service_of(self, user: str) -> str:
        """The service ``user`` stands for."""
        return self.users.get(user, user)

    @property
    def verified(self) -> bool:
        """Does this service's own user stand for it (so that its messages can be told from others')?"""
        return self.user is not None and self.service_of(self.user) == self.service

    def sent_by_us(self, user_id: Any) -> bool:
        """Did the service itself (or a user it trusts) send a message of this ``user_id``? When its own user is
        not known, it cannot tell: every message may be its own (as with a shared user)."""
        if self.user is None:
            return True
        return isinstance(user_id, str) and bool(user_id) and (user_id == self.user or user_id in self.trusted)

    def author(self, user_id: Any, claimed: Any) -> str | None:
        """The service that fired a message of this ``user_id`` whose ``fired_by`` header says ``claimed``."""
        if not isinstance(user_id, str) or not user_id or self.user is None:
            return None
        if self.sent_by_us(user_id):
            if not self.verified:  # a shared user: nothing tells the services apart
                return None
            if claimed is None:  # fired by this service through a client that does not say (Celery's own)
                return self.service
            return claimed if isinstance(claimed, str) and claimed else None
        return self.service_of(user_id)

    def believes(self, user_id: Any, claimed_service: Any) -> bool:
        """Is a message of ``user_id`` that says it comes from ``claimed_service`` (a heartbeat) believed?"""
        if self.user is None:  # this side cannot tell anyone apart
            return True
        if not isinstance(user_id, str) or not user_id:
            return False
        if user_id == self.user and not self.verified:  # a user shared with the sender: nothing to check against
            return True
        return bool(self.service_of(user_id) == claimed_service)


def vouch(identity: Identity, user_id: Any, headers: dict[str, Any]) -> bool:
    """Make ``headers`` (of a message of ``user_id``) say only what may be believed, in place: its author in
    ``fired_by`` ("" when none is verified), and, unless the service sent it itself, none of
    :data:`OWN_COPIES_ONLY` and a retry count of 0. Returns whether the service sent it itself."""
    own = identity.sent_by_us(user_id)
    headers[FIRED_BY] = identity.author(user_id, headers.get(FIRED_BY)) or ""
    if own:
        return True
    for name in OWN_COPIES_ONLY:
        headers.pop(name, None)
    if headers.get(EVENT_KEY) == "":  # a history replay's gate, which only the service sends
        headers.pop(EVENT_KEY)
    if "retries" in headers:
        headers["retries"] = 0
    return False
