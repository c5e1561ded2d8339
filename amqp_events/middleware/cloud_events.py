"""Reading CloudEvents: a message that arrives as a CloudEvent becomes an event message before anything
decodes it (:mod:`amqp_events.wire.cloud_events` says how); one that cannot be read is archived as it arrived."""

from __future__ import annotations

from dataclasses import replace

from amqp_events.core.context import Middleware, ServiceContext
from amqp_events.core.delivery import Received
from amqp_events.wire import cloud_events
from amqp_events.wire.message import JSON


class CloudEventsReader(Middleware):
    """Every worker has it: producers in any language may fire CloudEvents to a service."""

    def before_receive(self, context: ServiceContext, received: Received) -> Received:
        read = cloud_events.as_event_message(received.headers, received.body, received.content_type)
        if read is None:
            return received
        headers, body = read
        return replace(received, headers=headers, body=body, content_type=JSON, content_encoding="utf-8")
