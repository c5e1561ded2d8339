"""Coroutine handlers (``async def``): each call runs its coroutine to completion on an event loop of the calling
thread, so that everything around the call (middleware, outcomes, retries, the archive, acknowledgements) is
the same as for a plain handler.

The loop is made once per thread and kept: a handler's ``httpx.AsyncClient`` or database pool made on the first
call is still usable on the next. The call's context variables (``current_event()``, tracing) are the
coroutine's. A ``timeout`` (the handler's soft time limit) cancels the coroutine, which then fails as a handler
that raised ``TimeoutError`` does. Where the calling thread runs an event loop already (a test calling the
in-process mode from a coroutine), the coroutine runs on a loop of a helper thread meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

_local = threading.local()
#: Runs coroutines whose caller's thread has a running loop (one at a time: the caller waits for each).
_helper = ThreadPoolExecutor(1, thread_name_prefix="amqp-events-coroutines")


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
        if limit is not None:
            coroutine = _bounded(coroutine, limit)
        if asyncio._get_running_loop() is None:
            return _complete(_loop(), coroutine)
        context = contextvars.copy_context()  # the helper thread sees this call's context variables
        return _helper.submit(context.run, lambda: _complete(_loop(), coroutine)).result()

    return run


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
