"""What the worker's pool can do, read once from it: the one module that knows Celery's pool kinds. Every other
part of the worker asks a :class:`Host` what it needs (where a run happens, who consumes), never which pool it is.

======================  =========  ==========  ============  =====================
pool (``-P``)           consumes   runs here   in a thread   runs at once (here)
======================  =========  ==========  ============  =====================
consuming (default)     processes  no          no            (each process: solo)
solo                    this one   yes         consumer's    1
threads                 this one   yes         a pool's      ``-c``
prefork, gevent         this one   no          no            1
eventlet                refused: its worker reads the broker connection twice
======================  =========  ==========  ============  =====================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery.concurrency.solo import TaskPool as SoloPool
from celery.concurrency.thread import TaskPool as ThreadsPool


@dataclass(frozen=True)
class Host:
    #: Its processes consume the event queues (the consuming pool): the main process consumes none.
    consumes_in_processes: bool = False
    #: A handler runs in the consumer's own process: it may be run without Celery's request path, coroutine handlers
    #: run on this process's loop, and a handler that kills its process kills the consumer.
    runs_here: bool = False
    #: ...and in the consumer's own thread (solo): what it answers is sent at once.
    runs_in_the_consumers_thread: bool = False
    #: Runs at once in this process (a threads pool's size; otherwise one).
    runs_at_once: int = 1
    #: Where the pool takes a call to run in one of its threads (threads); ``None``: it has no threads of its own.
    apply_async: Any = None
    #: Its runs are greenlets (gevent): a coroutine handler's event loop would not know gevent's.
    greenlets: bool = False
    #: A consuming pool's process: the memory it shares with the main process (what remote control revoked).
    shared: Any = None
    #: Why a worker cannot run on it ("": it can).
    refused: str = ""

    @classmethod
    def of(cls, pool: Any) -> Host:
        if getattr(pool, "consumes_in_processes", False):
            return cls(consumes_in_processes=True)
        if isinstance(pool, ThreadsPool):
            return cls(runs_here=True, runs_at_once=max(1, pool.limit or 1), apply_async=pool.apply_async)
        if isinstance(pool, SoloPool):
            return cls(runs_here=True, runs_in_the_consumers_thread=True, shared=getattr(pool, "shared", None))
        kind = type(pool).__module__
        if kind == "celery.concurrency.eventlet":
            # Upstream (Celery 5.5-5.7, eventlet 0.3x-0.41): the consumer's connection is read from two green
            # threads ("Second simultaneous read on fileno"): nothing is handled. gevent has no such problem.
            return cls(refused="its worker reads the broker connection twice and handles nothing")
        return cls(greenlets=kind == "celery.concurrency.gevent")
