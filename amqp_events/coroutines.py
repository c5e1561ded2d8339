"""Coroutine handlers (``async def``) and the event loop a worker process owns for them.

A coroutine handler is called as any handler is, from the handling pipeline (middleware, outcomes, retries,
the archive, acknowledgements: one pipeline for both kinds), through :func:`run_to_completion`. Where its
coroutine then runs:

* In a worker with a :class:`WorkerLoop` (the solo and threads pools), the pipeline of each message runs in a
  greenlet on that loop, stepped in the consumer's thread (:meth:`WorkerLoop.spawn`): at the handler's call
  the greenlet hands the coroutine to the loop and is resumed with its result, so up to ``concurrency``
  messages are in flight while their handlers wait on I/O. The rest of the pipeline is plain code between
  two awaits. Any other call made in that process (an ordered handler, a history batch) runs its coroutine on
  the same loop, the caller waiting: a handler's ``httpx.AsyncClient`` or database pool belongs to one loop.
* Anywhere else (a prefork child, the in-process mode, a direct call): to completion on an event loop kept per
  thread; where the thread runs a loop already (a test calling the in-process mode from a coroutine), on a
  helper thread's loop meanwhile.

The call's context variables (``current_event()``, tracing) are the coroutine's. A ``timeout`` (the handler's
soft time limit) cancels the coroutine, which then fails as a handler that raised ``TimeoutError`` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import greenlet

T = TypeVar("T")

_local = threading.local()
#: Runs coroutines whose caller's thread has a running loop (one at a time: the caller waits for each).
_helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="amqp-events-coroutines")
#: The loop of this process's worker, while it runs one.
_worker_loop: WorkerLoop | None = None


def is_coroutine_handler(function: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(function)


def run_to_completion(
    function: Callable[..., Coroutine[Any, Any, T]], timeout: Callable[[], float | None]
) -> Callable[..., T]:
    """A plain function that runs ``function``'s coroutine to completion (``timeout()`` seconds at most)."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> T:
        limit = timeout()
        coroutine: Coroutine[Any, Any, T] = function(*args, **kwargs)
        return complete(coroutine if limit is None else _bounded(coroutine, limit))

    return run


def complete(coroutine: Coroutine[Any, Any, T]) -> T:
    """``coroutine``'s result, from plain code, on the loop the calling code's coroutines run on (see above)."""
    if isinstance(greenlet.getcurrent(), _Pipeline):
        return _await_in_pipeline(coroutine)
    worker_loop = _worker_loop
    if worker_loop is not None:
        return worker_loop.run(coroutine)
    if asyncio._get_running_loop() is None:
        return _complete(_loop(), coroutine)
    context = contextvars.copy_context()  # the helper thread sees this call's context variables
    return _helper.submit(context.run, lambda: _complete(_loop(), coroutine)).result()


@contextlib.contextmanager
def entered(manager: AbstractAsyncContextManager[T]) -> Iterator[T]:
    """An async context manager (an async database transaction) entered and left from plain code with
    :func:`complete`: the pipeline opens it around a coroutine handler's call on that handler's loop."""
    value = complete(_enter(manager))
    try:
        yield value
    except BaseException as error:
        if not complete(_exit(manager, error)):
            raise
    else:
        complete(_exit(manager, None))


async def _enter(manager: AbstractAsyncContextManager[T]) -> T:
    return await manager.__aenter__()


async def _exit(manager: AbstractAsyncContextManager[Any], error: BaseException | None) -> bool | None:
    if error is None:
        return await manager.__aexit__(None, None, None)
    return await manager.__aexit__(type(error), error, error.__traceback__)


async def _bounded(awaitable: Awaitable[T], limit: float) -> T:
    return await asyncio.wait_for(awaitable, limit)


def _loop() -> asyncio.AbstractEventLoop:
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = _local.loop = asyncio.new_event_loop()
    return loop


def _complete(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, T]) -> T:
    task = loop.create_task(coroutine)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        # Interrupted from outside (a worker's hard limit, a shutdown): the coroutine must not go on running
        # on this thread's loop during the next call.
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)
        raise


# -- the worker's loop -------------------------------------------------------------------------------------


class _Pipeline(greenlet.greenlet):  # type: ignore[misc]
    """A pipeline running on the worker's loop: it hands the coroutines it awaits to the task that runs it."""


def _await_in_pipeline(coroutine: Coroutine[Any, Any, T]) -> T:
    # Back to the task running this greenlet, with what to await; it switches back here with the result, or
    # throws the coroutine's exception in here.
    result: T = greenlet.getcurrent().parent.switch(coroutine)
    return result


async def _run_pipeline(function: Callable[..., T], args: tuple[Any, ...]) -> T:
    pipeline = _Pipeline(function)
    # The task's own context: what the pipeline sets (the attempt, current_event()) its coroutines see.
    pipeline.gr_context = greenlet.getcurrent().gr_context
    request = pipeline.switch(*args)
    while not pipeline.dead:
        try:
            value = await request
        except BaseException as error:  # the coroutine's failure, or this task cancelled: raised in the pipeline
            request = pipeline.throw(error)
        else:
            request = pipeline.switch(value)
    result: T = request
    return result


class WorkerLoop:
    """The event loop a worker process owns for its coroutine handlers, stepped by the thread that drives it.

    While a worker runs, the loop has no thread of its own: the worker's event loop (kombu's hub, in the
    consumer's thread) calls :meth:`step` when callbacks are due, a timer falls due or one of the loop's
    sockets is readable (:mod:`amqp_events.celery.coroutine_loop`). A message's pipeline then runs and is
    acked in the thread that owns the channel, and nothing crosses threads (two threads taking turns on the
    GIL, a message crossing twice, cost 0.57x the plain handler's drain; measured in bench/).
    :meth:`finish` runs it in its driver's thread for the last pipelines of a warm shutdown, then hands it a
    thread of its own.

    :meth:`spawn` runs a message's pipeline on it, ``concurrency`` at most at a time (the others wait their
    turn on the loop, already taken from the broker). :meth:`finish` lets the running ones finish for a while,
    then cancels the rest: a cancelled pipeline ends without an outcome, its message unacked.
    """

    def __init__(self, concurrency: int) -> None:
        self.loop = asyncio.new_event_loop()
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[Any]] = set()  # touched only where the loop runs
        # The thread that steps the loop: the one that made it (a consumer's), until another steps it (Celery's
        # start_worker runs the consumer's event loop in a thread of its own).
        self._driver = threading.get_ident()
        self._thread: threading.Thread | None = None  # the loop's own, once handed over

    def start(self) -> None:
        global _worker_loop
        _worker_loop = self

    @property
    def selector_fd(self) -> int:
        """Readable when one of the loop's sockets is (its selector's own descriptor: epoll's, on Linux)."""
        fd: int = self.loop._selector.fileno()  # type: ignore[attr-defined]  # asyncio's selector loop
        return fd

    def due(self) -> bool:
        """Are callbacks waiting for a step (read after a step: asyncio's queue of ready callbacks, which a
        call from another thread may have joined while the step ran)?"""
        return bool(self.loop._ready)  # type: ignore[attr-defined]

    def next_deadline(self) -> float | None:
        """When the loop's earliest timer falls due (on ``loop.time()``'s clock), if it has one."""
        scheduled = self.loop._scheduled  # type: ignore[attr-defined]  # a heap of timer handles
        return scheduled[0].when() if scheduled else None

    def drive_from_here(self) -> None:
        """The calling thread steps the loop from now on (it runs the worker's event loop)."""
        self._driver = threading.get_ident()

    def step(self) -> None:
        """One pass of the loop in the calling thread: its ready sockets read, its due timers and the callbacks
        that were ready run (those they make ready wait for the next step)."""
        self._driver = threading.get_ident()
        self.loop.stop()  # asyncio: run_forever after stop() makes one pass
        self.loop.run_forever()

    def hand_over(self) -> None:
        """From now on the loop runs in a thread of its own: its driver steps it no more (the worker stops), and
        threads may still wait on it."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.loop.run_forever, name="amqp-events-loop", daemon=True)
            self._thread.start()

    @property
    def handed_over(self) -> bool:
        return self._thread is not None

    def _drives(self) -> bool:
        return self._thread is None and self._driver == threading.get_ident()

    def spawn(self, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Run ``function(*args)`` on the loop, in a greenlet whose coroutine handlers' calls are awaited."""
        if self._drives():
            self._start(function, args)
        else:
            self.loop.call_soon_threadsafe(self._start, function, args)

    def _start(self, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        task = self.loop.create_task(self._spawned(function, args))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the pipeline logged and settled what went wrong

    async def _spawned(self, function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        async with self._slots:
            return await _run_pipeline(function, args)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop in this call's context; the calling thread waits for it (the driver's
        thread runs the loop meanwhile, other threads' calls are stepped by it)."""
        in_context = _in_context(coroutine, contextvars.copy_context())
        if self._drives():
            return _complete(self.loop, in_context)
        future = asyncio.run_coroutine_threadsafe(in_context, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # interrupted from outside: the coroutine must not go on meanwhile
            raise

    def finish(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the pipelines in flight, cancel the rest; returns how many were
        cancelled (those not started yet included). Then the loop runs in a thread of its own, for the threads
        that may still wait on it.

        Called by the driver: a pipeline's greenlet goes on only in the thread it began in. From another thread
        (the driver is gone), the pipelines stepped so far cannot go on: they end unsettled.
        """
        if not self._drives():
            self.hand_over()
            return asyncio.run_coroutine_threadsafe(self._finish(timeout), self.loop).result()
        given_back = _complete(self.loop, self._finish(timeout))
        self.hand_over()
        return given_back

    def stop(self) -> None:
        """Stop the loop (and its thread); :meth:`finish` first."""
        global _worker_loop
        if _worker_loop is self:
            _worker_loop = None
        self.hand_over()
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    async def _finish(self, timeout: float) -> int:
        if not self._tasks:
            return 0
        left = set(self._tasks)
        if timeout > 0:
            _, left = await asyncio.wait(left, timeout=timeout)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=5)  # each ends at its next await
        return len(left)


async def _in_context(coroutine: Coroutine[Any, Any, T], context: contextvars.Context) -> T:
    """Await ``coroutine`` as a task of its own made in ``context`` (a task runs in a copy of the context it
    was made in); cancelling this cancels it."""
    return await context.run(asyncio.ensure_future, coroutine)
