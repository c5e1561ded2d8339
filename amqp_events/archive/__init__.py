"""A service's archive, as an operator sees it: listing, replaying, purging, exporting what it holds.

The format of an archived copy is the wire's (:mod:`amqp_events.wire.archived`).
"""

from amqp_events.archive.operations import Archive, ReplayReport, Selection, replay_message
from amqp_events.wire.archive_entries import ArchivedMessage

__all__ = ["Archive", "ArchivedMessage", "ReplayReport", "Selection", "replay_message"]
