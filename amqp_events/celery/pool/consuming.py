"""The consuming pool's main process: starts ``-c N`` processes that each consume, watches them, starts another
when one ends, and kills a run past its hard time limit.

Celery's prefork pool receives every message in the main process and pipes it to a child; on a fast stream that
one process is the bottleneck. Here each process holds its own connection and consumes (see
:mod:`amqp_events.celery.pool.process`), so nothing passes through the main process. The main process keeps what
is the worker's as a whole: its remote control (ping, breakers, ``cancel_consumer`` and ``add_consumer``, which
the processes follow, shutdown), heartbeats, health probes and the metrics endpoint (the processes write their
metrics to files it sums).

A process that dies mid-run (SIGKILL, the OOM killer, a hard time limit) leaves its messages unacked: the broker
delivers them again, flagged redelivered, and each counts as a lost run; past the limit it is archived. A process
that stops by itself (recycled) is replaced at once; one that keeps failing before its first run is started again
after a growing pause (1 s, 2 s, ... 30 s).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from multiprocessing.process import BaseProcess
from typing import Any

from celery.concurrency.base import BasePool
from celery.utils.nodenames import default_nodename
from celery.worker import state

from amqp_events.celery.pool.mirror import Mirror
from amqp_events.celery.pool.process import Assignment, serve
from amqp_events.celery.pool.shared import Shared
from amqp_events.errors import WorkerStartError
from amqp_events.metrics.serve import forget_process

logger = logging.getLogger(__name__)

#: Seconds between two looks at the processes (ended ones, runs past their hard limit).
WATCH_EVERY = 0.2
LONGEST_PAUSE = 30.0
#: The worker's options each process's solo worker takes as they are.
WORKER_OPTIONS = ("task_events", "optimization", "prefetch_multiplier", "disable_rate_limits", "worker_lost_wait")


class ConsumingPool(BasePool):  # type: ignore[misc]
    """``-c N`` processes that each consume (the default pool of ``celery worker`` for an events app)."""

    #: The main process consumes no event queue (read by the consumer and its steps).
    consumes_in_processes = True
    #: Stopping waits for the processes: not from a signal handler.
    signal_safe = False
    #: Hard time limits are enforced (each process's own, by the main process).
    enforces_time_limits = True

    def __init__(self, limit: int | None = None, **options: Any) -> None:
        super().__init__(limit, **options)
        self.limit = max(1, int(limit or 1))
        #: The worker this pool belongs to (set by :class:`amqp_events.celery.conf.EventsWorker`).
        self.worker: Any = None
        self.time_limit, self.soft_time_limit = options.get("timeout"), options.get("soft_timeout")
        self.max_tasks, self.max_memory_kib = options.get("maxtasksperchild"), options.get("max_memory_per_child")
        # Room for `celery control pool_grow` (the shared memory is made before the processes fork).
        capacity = max(2 * self.limit, self.limit + 4)
        self.shared = _shared_memory(self.app, capacity, self.time_limit, self.soft_time_limit)
        self.processes: list[BaseProcess | None] = [None] * capacity
        self.early_failures = [0] * capacity
        self.start_after = [0.0] * capacity
        self.watching: Any = None
        self.stopping = False
        self.mirror: Mirror | None = None

    # -- Celery's pool interface -----------------------------------------------------------------------------

    def on_start(self) -> None:
        if getattr(self.worker, "autoscale", None):
            raise WorkerStartError(
                "--autoscale is not supported by the consuming pool (celery worker's default for an events app): "
                "size it with -c N and change it at run time with `celery control pool_grow N` / `pool_shrink N`, "
                "or run -P prefork --autoscale"
            )
        self.mirror = Mirror(self.shared, getattr(self.worker, "hostname", None) or default_nodename(None))
        self.shared.revoke(list(state.revoked)[-len(self.shared.revoked) :] if state.revoked else [])  # --statedb
        for slot in range(self.limit):
            self.start_process(slot)

    def did_start_ok(self) -> bool:
        """Did every process start (one that died after it began a run did: the run ended it, and it is replaced;
        a backlog of poison must not stop the worker as it starts)?"""
        return all(
            process is not None and (process.exitcode is None or self.shared.ran[slot])
            for slot, process in enumerate(self.processes[: self.limit])
        )

    def register_with_event_loop(self, hub: Any) -> None:
        """On every start of the worker's event loop (a reconnection resets it)."""
        if self.watching is not None:
            self.watching.cancel()
        self.watching = hub.call_repeatedly(WATCH_EVERY, self.watch)

    def on_apply(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the consuming pool's main process runs nothing: its processes consume and run")

    def on_stop(self) -> None:
        """Warm: each process finishes what it runs, acks, and stops; then the worker stops."""
        self._end(signal.SIGTERM)

    def on_terminate(self) -> None:
        """Cold: the processes are killed; their unacked messages come back from the broker."""
        self._end(signal.SIGKILL)

    def restart(self) -> None:
        """``celery control pool_restart``: each process stops warmly and another starts (new code imported)."""
        for process in self.processes:
            if process is not None and process.pid:
                os.kill(process.pid, signal.SIGTERM)

    def terminate_job(self, pid: int, how: int | None = None) -> None:
        """``revoke --terminate``: the process running it is killed (and replaced)."""
        if pid in {process.pid for process in self.processes if process is not None}:
            os.kill(pid, how or signal.SIGKILL)

    def _get_info(self) -> dict[str, Any]:
        info: dict[str, Any] = super()._get_info()
        info.update(
            {
                "max-concurrency": self.limit,
                "processes": [process.pid for process in self.processes if process is not None],
                "max-tasks-per-child": self.max_tasks,
                "timeouts": (self.soft_time_limit or 0, self.time_limit or 0),
            }
        )
        return info

    @property
    def num_processes(self) -> int:
        return self.limit

    def live_slots(self) -> range:
        """The slots the pool keeps a process in (``pool_shrink`` stops those past the limit)."""
        return range(self.limit)

    def grow(self, n: int = 1) -> None:
        """``celery control pool_grow N``: N more processes, started at once."""
        room = len(self.processes) - self.limit
        if n > room:
            raise ValueError(
                f"the pool can grow by {room} more process(es) (to {len(self.processes)}: its shared memory was made "
                "for that many); restart the worker with a larger -c"
            )
        for slot in range(self.limit, self.limit + n):
            self.limit += 1
            self.start_after[slot] = 0.0
            if self.processes[slot] is None:
                self.start_process(slot)

    def shrink(self, n: int = 1) -> None:
        """``celery control pool_shrink N``: the last N processes stop warmly (they finish their run)."""
        if n >= self.limit:
            raise ValueError(f"the pool has {self.limit} process(es): it keeps at least one")
        for _ in range(n):
            self.limit -= 1
            process = self.processes[self.limit]
            if process is not None and process.pid and process.exitcode is None:
                os.kill(process.pid, signal.SIGTERM)

    def set_time_limits(self, task: str, soft: float, hard: float) -> None:
        """``celery control time_limit``: the processes apply these to ``task``'s next runs."""
        if task in self.shared.handlers:
            index = self.shared.handlers.index(task)
            self.shared.soft[index], self.shared.hard[index] = float(soft or 0.0), float(hard or 0.0)

    # -- the processes ---------------------------------------------------------------------------------------

    def start_process(self, slot: int) -> None:
        worker = self.worker
        assignment = Assignment(
            slot=slot,
            hostname=getattr(worker, "hostname", None) or default_nodename(None),
            shared=self.shared,
            time_limit=self.time_limit,
            soft_time_limit=self.soft_time_limit,
            max_tasks=self.max_tasks,
            max_memory_kib=self.max_memory_kib,
            worker_options=tuple((name, getattr(worker, name)) for name in WORKER_OPTIONS if hasattr(worker, name)),
        )
        self.shared.ran[slot] = 0
        process = multiprocessing.get_context("fork").Process(
            target=serve, args=(self.app, assignment), name=f"ConsumingProcess-{slot + 1}", daemon=False
        )
        process.start()
        self.processes[slot] = process

    def watch(self) -> None:
        """Replace the processes that ended; kill those whose run is past its hard time limit; show the runs in
        Celery's state."""
        now = time.monotonic()
        for overdue in self.shared.overdue(now):
            self.shared.deadline[overdue.slot] = 0.0
            process = self.processes[overdue.slot]
            if process is not None and process.pid and process.exitcode is None:
                task = self.app.tasks.get(overdue.handler) if self.app is not None else None
                logger.error(
                    "hard time limit (%ss) of %s exceeded in pool process %d: killed; its message comes back "
                    "from the broker and counts as a lost run",
                    getattr(task, "time_limit", None) or self.time_limit,
                    getattr(getattr(task, "handler", None), "name", overdue.handler),
                    process.pid,
                )
                os.kill(process.pid, signal.SIGKILL)
        for slot, process in enumerate(self.processes):
            if process is not None and process.exitcode is not None:
                self._ended(slot, process, now)
            if (
                slot < self.limit
                and self.processes[slot] is None
                and now >= self.start_after[slot]
                and self._may_start()
            ):
                self.start_process(slot)
        if self.mirror is not None:
            self.mirror.sync(self.processes)

    def _ended(self, slot: int, process: BaseProcess, now: float) -> None:
        process.join()
        if process.pid:
            forget_process(process.pid)
        self.processes[slot] = None
        self.shared.process_ended(slot)
        code = process.exitcode
        if code == 0:  # recycled, or restarted by remote control: it said why
            self.early_failures[slot], self.start_after[slot] = 0, now
            return
        how = f"was killed by {signal.Signals(-code).name}" if code and code < 0 else f"exited with {code}"
        early = not self.shared.ran[slot]
        self.early_failures[slot] = self.early_failures[slot] + 1 if early else 0
        pause = min(LONGEST_PAUSE, 2.0 ** (self.early_failures[slot] - 1)) if early else 0.0
        self.start_after[slot] = now + pause
        logger.error(
            "pool process %d %s: what it was running comes back from the broker, counted as a lost run (what it "
            "had only prefetched comes back uncounted); another process starts%s",
            process.pid, how, f" in {pause:g}s (it failed before its first run)" if pause else "",
        )  # fmt: skip

    def _may_start(self) -> bool:
        return not self.stopping and state.should_stop in (None, False) and state.should_terminate in (None, False)

    def _end(self, how: signal.Signals) -> None:
        self.stopping = True
        if self.watching is not None:
            self.watching.cancel()
            self.watching = None
        self._signal_all(how)
        for process in self.processes:
            while process is not None and process.exitcode is None:
                process.join(1.0)
                if how != signal.SIGKILL and state.should_terminate not in (None, False):  # a cold shutdown now
                    how = signal.SIGKILL
                    self._signal_all(how)
            if process is not None and process.pid:
                forget_process(process.pid)

    def _signal_all(self, how: signal.Signals) -> None:
        for process in self.processes:
            if process is not None and process.pid and process.exitcode is None:
                os.kill(process.pid, how)


def _shared_memory(app: Any, slots: int, hard: float | None, soft: float | None) -> Shared:
    """What the processes share with this one. Every queue of the app is there: those the worker was not started
    to consume (``-Q``, ``-X``: applied by now) begin cancelled, for ``add_consumer`` to start. Each handler's time
    limits are its own, else the worker's (``--time-limit``, ``--soft-time-limit``)."""
    if app is None:
        return Shared(slots, ())
    queues = app.amqp.queues
    selected = set(queues.consume_from)  # first: it adds the queues of handlers imported since the table was made
    tasks = sorted(app.tasks)
    limits = [
        (app.tasks[name].soft_time_limit or soft or 0.0, app.tasks[name].time_limit or hard or 0.0) for name in tasks
    ]
    return Shared(slots, tasks, sorted(queues), set(queues) - selected, limits)
