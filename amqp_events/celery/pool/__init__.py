"""The consuming pool: ``celery -A app worker -c N`` of an events app runs N processes that each consume.

Chosen when the command names no pool (no ``-P``, no ``worker_pool`` setting); ``-P prefork`` (or any other
pool) given still gets Celery's. To choose it by name: ``worker_pool = "amqp_events.celery.pool:ConsumingPool"``,
or ``CELERY_CUSTOM_WORKER_POOL=amqp_events.celery.pool:ConsumingPool celery -A app worker -P custom``.

* :mod:`~amqp_events.celery.pool.consuming`: the main process (starts, watches and replaces the processes);
* :mod:`~amqp_events.celery.pool.process`: one process (a solo worker with time limits and recycling);
* :mod:`~amqp_events.celery.pool.shared`: what they share with the main process (deadlines, runs in progress);
* :mod:`~amqp_events.celery.pool.mirror` and :mod:`~amqp_events.celery.pool.control`: Celery's remote control,
  heartbeats and ``inspect``, answered for the processes by the main process.
"""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from amqp_events.celery.pool.consuming import ConsumingPool

__all__ = ["ConsumingPool", "chosen_by_default"]


def chosen_by_default(conf: Any) -> bool:
    """Is this worker's pool Celery's default, neither ``-P`` nor ``worker_pool`` naming one?

    Upstream: ``celery worker``'s ``--pool`` defaults to ``prefork``, which a ``worker_pool`` setting replaces;
    ``app.conf.defaults`` ends with Celery's own defaults, after the app's and the configuration objects'.
    """
    context = click.get_current_context(silent=True)
    if context is None or "pool" not in context.params:
        return False  # not started by the `celery worker` command
    if context.get_parameter_source("pool") is not ParameterSource.DEFAULT:
        return False
    conf.worker_pool  # noqa: B018 (loads a configuration still pending, whose maps are read below)
    return not any("worker_pool" in values for values in [conf.changes, *conf.defaults[:-1]])
