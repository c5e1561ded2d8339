"""Reading, replaying and purging a service's archive.

The archive is a bounded quorum queue (``<service>.archive``) holding the
messages that ran out of retries or can never succeed, each with the
``archive_*`` headers of :mod:`amqp_events.wire.archived`. This module browses it
without consuming it: messages are fetched unacknowledged and handed back
to the queue when the channel closes, except those an operation is meant to
remove, which are acked one by one, and for a replay only after the broker
confirmed the replayed copy. An interrupted replay therefore loses nothing
(at worst a message is replayed twice).
"""

from __future__ import annotations

import builtins
import getpass
import json
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import IO, Any

from amqp_events.archive.grouping import group_of
from amqp_events.core.context import Replay, ServiceContext
from amqp_events.core.publishing import publish_routed
from amqp_events.topology import archive_queue_name
from amqp_events.topology.names import fired_event, to_queue
from amqp_events.wire.archive_entries import ArchivedMessage
from amqp_events.wire.message import FIRED_AS, FIRED_BY, FOR_HANDLER, JSON, OutgoingMessage, copy_headers, json_body
from amqp_events.wire.parked import PARKS_KEY, RELEASE_PARKED
from amqp_events.wire.trust import OWN_COPIES_ONLY


@dataclass(frozen=True)
class Selection:
    """Which archived messages an operation touches (every given criterion must match)."""

    ids: frozenset[str] = frozenset()
    event: str | None = None
    reason: str | None = None
    limit: int | None = None
    #: Archived at this time or later.
    since: datetime | None = None
    #: Of this failure group (:mod:`amqp_events.archive.grouping`).
    group: str | None = None

    @classmethod
    def of(
        cls,
        ids: Iterable[str] = (),
        event: str | None = None,
        reason: str | None = None,
        limit: int | None = None,
        since: datetime | None = None,
        group: str | None = None,
    ) -> Selection:
        return cls(frozenset(ids), event, reason, limit, since, group)

    @classmethod
    def exactly(cls, entries: Iterable[ArchivedMessage]) -> Selection:
        """These messages and no other: what an operator was shown and confirmed."""
        ids = [entry.id for entry in entries]
        return cls(frozenset(ids), limit=len(ids))

    def matches(self, archived: ArchivedMessage) -> bool:
        return (
            (not self.ids or archived.id in self.ids)
            and self.admits(archived.event, archived.reason, archived.archived_at)
            and (self.group is None or group_of(archived) == self.group)
        )

    def admits(self, event: str, reason: str, archived_at: datetime | None) -> bool:
        """Do its event, reason and time criteria take a message of these (what a listing of summaries, such
        as the console's index, can check)?"""
        return (
            (self.event is None or event == self.event)
            and (self.reason is None or reason == self.reason)
            and (self.since is None or (archived_at is not None and archived_at >= self.since))
        )

    @property
    def chooses(self) -> bool:
        """Does it choose anything narrower than the whole archive (ids, an event, a reason, a time, a group)?"""
        return bool(self.ids or self.event or self.reason or self.since or self.group)


EVERYTHING = Selection()


@dataclass
class ReplayReport:
    #: Ids sent back to their queue (and removed from the archive).
    replayed: list[str] = field(default_factory=list)
    #: Ids whose original queue no longer exists: left in the archive.
    unroutable: list[str] = field(default_factory=list)
    #: Ids whose body was cut when they were archived (too large): they cannot run again, and stay.
    cut: list[str] = field(default_factory=list)


class Archive:
    """The archive of ``context``'s service (or of ``service``, for operators looking at another one).

    Get one with :meth:`amqp_events.celery.EventsApp.archive`.
    """

    def __init__(self, context: ServiceContext, service: str | None = None) -> None:
        self.context = context
        self.service = service or context.name
        self.queue = archive_queue_name(self.service)

    def count(self) -> int:
        """Messages in the archive right now (without touching them)."""
        return self.context.transport.count(self.queue)

    def list(self, selection: Selection = EVERYTHING) -> list[ArchivedMessage]:
        """The archived messages that match, oldest first. Nothing is consumed."""
        with self._browse() as messages:
            return [archived for archived, _ in _take(messages, selection)]

    def get(self, message_id: str) -> ArchivedMessage | None:
        found = self.list(Selection.of(ids=[message_id], limit=1))
        return found[0] if found else None

    def replay(
        self,
        selection: Selection = EVERYTHING,
        on_replayed: Callable[[ArchivedMessage], None] | None = None,
        new_ids: bool = False,
        replayed_by: str = "",
    ) -> ReplayReport:
        """Send matching messages back to the queue they came from, with their retry count reset.

        Each archived copy is removed only after the broker confirmed its
        replacement; ``on_replayed`` is called in between, once per message
        (a progress hook: if the process dies there, the message is in both
        places, a duplicate rather than a loss). With ``new_ids`` each copy
        gets a new event id (``replay_of`` keeps the old one), so that a
        handler with an inbox runs it even if it handled the event before.
        ``replayed_by`` (who, e.g. ``user@host``) is logged, stamped on each
        copy (the ``replayed_by`` header) and, with tracing on, recorded on
        each replay's span.
        """
        report = ReplayReport()
        by = replayed_by or f"{getpass.getuser()}@{socket.gethostname()}"
        with self._browse() as messages:
            for archived, remove in _take(messages, selection):
                if archived.body_cut:
                    report.cut.append(archived.id)
                elif self._send_back(archived, new_ids, by):
                    if on_replayed:
                        on_replayed(archived)
                    remove()
                    report.replayed.append(archived.id)
                else:
                    report.unroutable.append(archived.id)
        return report

    def _send_back(self, archived: ArchivedMessage, new_id: bool, by: str) -> bool:
        """Publish ``archived``'s replay, through the ``before_replay``/``after_replay`` hooks; False when its
        queue no longer exists."""
        message = replay_message(archived, new_id=new_id, by=by, events_exchange=self.context.settings.exchange)
        replay = Replay(self.context, message, archived.headers, by)
        middleware = self.context.middleware
        for before in middleware.before_replay:
            before(replay)
        try:
            routed = self.context.transport.publish(replay.message)
        except BaseException as error:
            for after in middleware.after_replay:
                after(replay, error)
            raise
        if routed:
            for after in middleware.after_replay:
                after(replay, None)
        return routed

    def retry_edited(
        self, message_id: str, args: builtins.list[Any], kwargs: dict[str, Any], replayed_by: str = ""
    ) -> ArchivedMessage | None:
        """Replay one archived message with other arguments (a data fix), as :meth:`replay` does: removed only
        once its edited copy is confirmed. Returns the original (``None``: no such message); ``ValueError``
        when its body is not an event's (nothing to edit) or its queue is gone."""
        by = replayed_by or f"{getpass.getuser()}@{socket.gethostname()}"
        with self._browse() as messages:
            for archived, remove in _take(messages, Selection.of(ids=[message_id], limit=1)):
                if archived.arguments is None or archived.body_cut:
                    raise ValueError(f"{message_id}: its body is not an event's arguments: it cannot be edited")
                embed = archived.payload[2]
                body = json_body([args, kwargs, embed])
                edited = replace(archived, body=body, content_type=JSON, content_encoding="utf-8")
                if not self._send_back(edited, False, by):
                    raise ValueError(f"{message_id}: its queue {archived.queue!r} no longer exists")
                remove()
                return archived
        return None

    def purge(self, selection: Selection = EVERYTHING) -> builtins.list[str]:
        """Delete matching messages for good; returns their ids.

        The events of an ordered handler parked behind a purged one go on.
        """
        purged = []
        with self._browse() as messages:
            for archived, remove in _take(messages, selection):
                if PARKS_KEY in archived.headers:  # the events parked behind it go on
                    publish_routed(self.context, release_command(archived))
                remove()
                purged.append(archived.id)
        return purged

    def export(self, out: IO[str], selection: Selection = EVERYTHING) -> int:
        """Write matching messages as JSON lines (nothing is removed); returns how many."""
        archived = self.list(selection)
        for entry in archived:
            out.write(json.dumps(entry.to_json()) + "\n")
        return len(archived)

    def load(self, lines: Iterable[str]) -> int:
        """Put exported messages (JSON lines) back into this archive; returns how many."""
        loaded = 0
        for line in lines:
            if line.strip():
                archived = ArchivedMessage.from_json(json.loads(line))
                headers = archived.recorded_headers()  # what its reading believed, and no more
                publish_routed(
                    self.context,
                    OutgoingMessage(
                        *to_queue(self.queue),
                        headers=headers,
                        body=archived.body,
                        message_id=archived.id,
                        content_type=archived.content_type or "application/octet-stream",
                        content_encoding=archived.content_encoding or "binary",
                    ),
                )
                loaded += 1
        return loaded

    @contextmanager
    def _browse(self) -> Iterator[Iterator[tuple[ArchivedMessage, Callable[[], None]]]]:
        """Every archived message, oldest first (by ``archived_at``: a quorum queue given back the messages a
        browse took may not keep their order), each with the function that removes it."""
        with self.context.transport.browse(self.queue) as stored:
            identity = self.context.identity
            entries = [(ArchivedMessage.of(message, identity), remove) for message, remove in stored]
            yield iter(sorted(entries, key=lambda entry: _archived_at(entry[0])))


def _archived_at(archived: ArchivedMessage) -> datetime:
    """When it was archived; one that does not say comes last (the sort keeps such messages in their order)."""
    return archived.archived_at or datetime.max.replace(tzinfo=timezone.utc)


def replay_message(
    archived: ArchivedMessage, new_id: bool = False, by: str = "", events_exchange: str = ""
) -> OutgoingMessage:
    """What a replay publishes: the original body and envelope, retry count reset, straight to its queue.

    It goes by what the archive recorded as facts (:meth:`ArchivedMessage.of`): the queue, the handler chosen for
    it, and its verified author, which the receiving worker judges as it judged the original. When no handler was
    chosen, the event it was fired as (``events_exchange``: the events exchange's name) goes with it, for that
    judgement. Of a message the broker dead-lettered into the archive as its sender wrote it, no header only the
    service's own copies carry goes on. ``new_id``: under a new event id, the old one in the ``replay_of``
    header. ``by``: who replayed it (the ``replayed_by`` header; the last replay's, on the copies of the copy too).
    """
    headers = dict(archived.headers)
    if archived.dead_lettered:
        for name in OWN_COPIES_ONLY:
            headers.pop(name, None)
    headers[FIRED_BY] = archived.fired_by
    if archived.task:
        headers.update({"task": archived.task, FOR_HANDLER: archived.task})
    else:
        fired_as = fired_event(archived.exchange, archived.routing_key, events_exchange) if events_exchange else None
        if fired_as:
            headers[FIRED_AS] = fired_as
    headers = copy_headers(headers, retries=0)
    if by:
        headers["replayed_by"] = by
    if new_id:
        headers.update(id=str(uuid.uuid4()), replay_of=archived.id)
    return OutgoingMessage(
        *to_queue(archived.queue),
        headers=headers,
        body=archived.body,
        message_id=str(headers.get("id") or archived.id or uuid.uuid4()),  # one without an id is judged again
        content_type=archived.content_type or "application/octet-stream",
        content_encoding=archived.content_encoding or "binary",
    )


def release_command(archived: ArchivedMessage) -> OutgoingMessage:
    """What discarding the head of a parked sequence sends its partition: release the events behind it."""
    message = replay_message(archived)
    return replace(message, headers={**message.headers, RELEASE_PARKED: archived.id})


def _take(
    messages: Iterator[tuple[ArchivedMessage, Callable[[], None]]], selection: Selection
) -> Iterator[tuple[ArchivedMessage, Callable[[], None]]]:
    # Every message is read before any is chosen (see Archive._browse): the first ``limit`` are the oldest.
    taken = 0
    for archived, ack in messages:
        if (selection.limit is None or taken < selection.limit) and selection.matches(archived):
            taken += 1
            yield archived, ack
