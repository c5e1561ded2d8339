"""The consuming pool's runs in Celery's worker state: what remote control, heartbeats and ``inspect`` read.

Celery's commands answer from the worker's main process: ``inspect active`` and ``query_task`` list
``celery.worker.state.active_requests``, ``revoke --terminate`` ends the requests it finds there, a heartbeat
counts them, ``inspect stats`` reads ``total_count``. With the consuming pool the main process runs nothing:
:class:`Mirror` puts each run the processes write to shared memory (:mod:`amqp_events.celery.pool.shared`) there
as a :class:`ProcessRun`, and the runs they ended into the totals, every time the pool looks at its processes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from typing import Any

from celery.worker import state as worker_state

from amqp_events.celery.pool.shared import Shared


class ProcessRun:
    """A run in a process of the pool, as Celery's state keeps a request: shown by ``inspect active`` and
    ``query_task``, ended by ``revoke --terminate`` (the process is killed: the run is lost)."""

    acknowledged = False

    def __init__(self, shown: bytes, started: float, pid: int, hostname: str) -> None:
        task, event_id, exchange, routing_key, arguments = (shown.decode("utf-8", "replace").split("\0", 4) + [""] * 5)[
            :5
        ]
        self.id, self.name, self.worker_pid, self.hostname = event_id, task, pid, hostname
        self.delivery_info = {"exchange": exchange, "routing_key": routing_key, "priority": None, "redelivered": None}
        self.args, self.kwargs = _arguments(arguments)
        # Celery's requests start on the monotonic clock.
        self.time_start = time.monotonic() - max(0.0, time.time() - started)

    def info(self, safe: bool = False) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "args": repr(self.args) if safe else self.args,
            "kwargs": repr(self.kwargs) if safe else self.kwargs,
            "type": self.name,
            "hostname": self.hostname,
            "time_start": self.time_start,
            "acknowledged": self.acknowledged,
            "delivery_info": self.delivery_info,
            "worker_pid": self.worker_pid,
        }

    def terminate(self, pool: Any, signal: int | None = None) -> None:
        pool.terminate_job(self.worker_pid, signal)


def _arguments(text: str) -> tuple[Any, Any]:
    """The run's ``(args, kwargs)`` (what did not fit the slot shows as the text it held)."""
    try:
        args, kwargs = json.loads(text)
        return args, kwargs
    except (ValueError, TypeError):
        return [f"{text}…"], {}


class Mirror:
    """Keeps Celery's worker state of the main process in step with the processes' runs."""

    def __init__(self, shared: Shared, hostname: str) -> None:
        self.shared, self.hostname = shared, hostname
        self.runs: dict[tuple[int, int, float], ProcessRun] = {}

    def sync(self, processes: Sequence[BaseProcess | None]) -> None:
        seen: dict[tuple[int, int, float], ProcessRun] = {}
        for slot, process in enumerate(processes):
            if process is None or not process.pid:
                continue
            for place, started, shown in self.shared.running(slot):
                key = (slot, place, started)
                seen[key] = self.runs.get(key) or ProcessRun(shown, started, process.pid, self.hostname)
        for key in self.runs.keys() - seen.keys():
            ended = self.runs[key]
            if worker_state.requests.get(ended.id) is ended:
                del worker_state.requests[ended.id]
            worker_state.active_requests.discard(ended)
            worker_state.reserved_requests.discard(ended)
        for key in seen.keys() - self.runs.keys():
            run = seen[key]
            worker_state.requests[run.id] = run
            worker_state.active_requests.add(run)
            worker_state.reserved_requests.add(run)
        self.runs = seen
        totals = {task: count for task, count in self.shared.totals().items() if count}
        worker_state.total_count.clear()
        worker_state.total_count.update(totals)
        worker_state.all_total_count[0] = sum(totals.values())
