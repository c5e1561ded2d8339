"""Private, throwaway servers for development: a RabbitMQ node (:mod:`~amqp_events.local.broker`) or a cluster
of them (:mod:`~amqp_events.local.cluster`), each in a directory of its own. ``amqp-events broker`` and the test
harness start them; nothing in a producer or a worker imports this package."""
