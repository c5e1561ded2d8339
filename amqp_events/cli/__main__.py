"""``python -m amqp_events.cli``: the same as the ``amqp-events`` command."""

from amqp_events.cli import run

run()
