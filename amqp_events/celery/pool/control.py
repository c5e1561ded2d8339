"""Celery's remote control commands as a worker with the consuming pool answers them.

The main process answers remote control for the whole worker; the state the commands read or change lives in
its processes. Most commands work unchanged once the processes' runs are mirrored into Celery's state
(:mod:`amqp_events.celery.pool.mirror`): ``inspect active``, ``query_task``, ``stats``' totals, heartbeats,
``pool_grow``/``pool_shrink``. The others are wrapped here; each checks that its worker's pool is the consuming
one, and otherwise does exactly what Celery does:

* ``revoke`` (and ``terminate``): the ids go to the processes too (an event not started yet is archived with
  reason ``revoked`` when a process takes it); ``--terminate`` kills the process running it (the run is archived
  ``revoked`` as it comes back, the process replaced).
* ``time_limit``: every process applies it to the handler's next runs.
* ``rate_limit``: refused, saying why and what to use: Celery's limit counts per process and holds what waits in
  memory; the library's limits count across every worker and wait on the broker.
* ``active_queues``: the queues the processes consume (the main process consumes none).
* ``stats``: the processes' prefetch.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_celery_operators.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.utils.functional import maybe_list
from celery.worker.control import Panel, nok

from amqp_events.celery.steps import breakers_of

#: The commands wrapped, by name, with what they wrap (kept once per process).
_ORIGINALS: dict[str, Callable[..., Any]] = {}


def install() -> None:
    """Wrap the commands (once per process: Celery keeps one table of commands per process)."""
    for name, wrapper in WRAPPERS.items():
        if name not in _ORIGINALS:
            _ORIGINALS[name] = Panel.data[name]
            Panel.data[name] = wrapper


def _pool(state: Any) -> Any:
    """The worker's pool when it is the consuming pool (``None``: the command is Celery's own)."""
    consumer = state.consumer
    return consumer.pool if consumer.host.consumes_in_processes else None


def revoke(state: Any, task_id: Any, terminate: bool = False, signal: Any = None, **kwargs: Any) -> Any:
    pool = _pool(state)
    if pool is not None:  # the processes know it before a terminated run's message can come back
        pool.shared.revoke(set(maybe_list(task_id) or []))
    return _ORIGINALS["revoke"](state, task_id, terminate=terminate, signal=signal, **kwargs)


def terminate(state: Any, signal: Any, task_id: Any, **kwargs: Any) -> Any:
    return revoke(state, task_id, terminate=True, signal=signal)


def time_limit(state: Any, task_name: Any = None, hard: Any = None, soft: Any = None, **kwargs: Any) -> Any:
    answer = _ORIGINALS["time_limit"](state, task_name=task_name, hard=hard, soft=soft, **kwargs)
    if isinstance(answer, dict) and "ok" in answer:
        pool = _pool(state)
        if pool is not None:
            pool.set_time_limits(task_name, soft or 0.0, hard or 0.0)
        elif hasattr(state.consumer, "update_strategies"):  # Celery's requests take the limits their strategy
            state.consumer.update_strategies()  # read when it was made: made again, they take the new ones
    return answer


def rate_limit(state: Any, task_name: Any, rate_limit: Any, **kwargs: Any) -> Any:
    if _pool(state) is None:
        return _ORIGINALS["rate_limit"](state, task_name, rate_limit, **kwargs)
    return nok(
        "rate_limit is not applied by this worker's pool: Celery's limit counts per process and holds what waits "
        f"in the worker's memory. Limit {task_name} across every worker of the service, waiting on the broker: "
        f"give its handler rate_limit= (docs/guides/flow-control.md), then change it at run time with "
        f"`amqp-events -A <app> limits set {task_name} --rate-limit {rate_limit}`"
    )


def active_queues(state: Any) -> Any:
    pool = _pool(state)
    if pool is None:
        return _ORIGINALS["active_queues"](state)
    app = state.consumer.app
    not_consumed = pool.shared.cancelled_queues()
    breakers = breakers_of(app)
    if breakers is not None:
        not_consumed |= breakers.open_queues()
    return [
        dict(queue.as_dict(recurse=True))
        for name, queue in sorted(app.amqp.queues.consume_from.items())
        if name not in not_consumed
    ]


def stats(state: Any, **kwargs: Any) -> Any:
    answer = _ORIGINALS["stats"](state, **kwargs)
    pool = _pool(state)
    if pool is not None and isinstance(answer, dict):
        answer["prefetch_count"] = sum(pool.shared.prefetch[slot] for slot in pool.live_slots())
    return answer


WRAPPERS: dict[str, Callable[..., Any]] = {
    "revoke": revoke,
    "terminate": terminate,
    "time_limit": time_limit,
    "rate_limit": rate_limit,
    "active_queues": active_queues,
    "stats": stats,
}
