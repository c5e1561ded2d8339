"""The transactional outbox: events written as rows of the application's own transaction, published by a relay.

* :mod:`~amqp_events.outbox.schema`: its tables; :mod:`~amqp_events.outbox.store`: the rows on a database;
* :mod:`~amqp_events.outbox.targets`: the database handles rows are written on (SQLAlchemy, Django);
* :mod:`~amqp_events.outbox.writer`: firing into a transaction; :mod:`~amqp_events.outbox.relay`: the relay.
"""
