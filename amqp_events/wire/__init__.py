"""The wire format: event messages and their headers (:mod:`~amqp_events.wire.message`), archived copies
(:mod:`~amqp_events.wire.archived`) and CloudEvents (:mod:`~amqp_events.wire.cloud_events`). Pure: no I/O."""
