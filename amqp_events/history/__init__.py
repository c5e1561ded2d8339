"""The event history: every fired event kept in a RabbitMQ stream, searched and replayed (``amqp_events_history``)."""

from amqp_events.history.records import HistoricEvent, Query, parse_where
from amqp_events.history.replay import Cursor, HistoryReplay, HistoryReplayReport
from amqp_events.history.search import History, Stats
from amqp_events.topology.ownership import topic_matches

__all__ = [
    "Cursor",
    "HistoricEvent",
    "History",
    "HistoryReplay",
    "HistoryReplayReport",
    "Query",
    "Stats",
    "parse_where",
    "topic_matches",
]
