"""Upcasting: a handler that takes version N of an event's arguments is handed an event fired at an earlier version
turned into version N first, by functions it names, as Axon and EventStore upcast stored events; and one fired at a
later version without the arguments it does not take, so that a producer may move first.

``@app.handler(event, upcasters={1: v1_to_v2, 2: v2_to_v3})`` takes version 3. An event fired at version 1 (or
without an ``event_version`` header: every release before versions) goes through both functions, one fired at
version 2 through the second. Each is given the keyword arguments (a dict of its own) and returns those of the
next version. What waits on the broker stays as it was fired: live events, retries, and replays from the archive
and from the history are each upcast when they run, and a retry or an archived copy carries the event as fired.
An event of a later version than the handler takes reaches it without the arguments it has no parameter for (an
argument it requires and is not sent is refused as ever: only additions are forward-compatible).

The version is the sender's word (a header): it picks which of the handler's own functions run, or which of the
arguments sent it leaves out, never what handler runs. An upcaster that raises archives the event
(``bad_arguments``, saying which step failed): it can be replayed once the function is fixed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from amqp_events.core.context import Attempt, Middleware
from amqp_events.core.handler import Handler
from amqp_events.core.options import HandlerOptions
from amqp_events.core.outcome import CannotRun, Outcome, decide
from amqp_events.core.versions import Upcasters, UpcastFailed, as_handled
from amqp_events.settings import Settings
from amqp_events.wire.message import EVENT_VERSION, Reason


class UpcastOptions(TypedDict, total=False):
    """``@app.handler``'s option of event versions."""

    #: ``{1: v1_to_v2, 2: v2_to_v3}``: the handler takes the version after the last one named.
    upcasters: Upcasters | None


def _check(handler: Handler, options: Mapping[str, Any]) -> Mapping[str, Any]:
    upcasters = options["upcasters"]
    if upcasters is None:
        return {}
    if not isinstance(upcasters, Mapping) or not upcasters:
        raise TypeError(f"{handler.name}: upcasters must be a dict from versions to functions, not {upcasters!r}")
    versions = sorted(upcasters, key=lambda version: (not isinstance(version, int), str(version)))
    if not all(isinstance(version, int) and not isinstance(version, bool) and version >= 1 for version in versions):
        raise TypeError(f"{handler.name}: the upcasters' versions must be whole numbers from 1, not {versions!r}")
    if versions != list(range(versions[0], versions[-1] + 1)):
        raise TypeError(f"{handler.name}: the upcasters must follow one another (1, 2, 3 ...), not {versions!r}")
    if not all(callable(upcast) for upcast in upcasters.values()):
        raise TypeError(f"{handler.name}: each upcaster must be a function of the keyword arguments")
    return {}


#: ``upcasters=``: the handler option of this middleware.
UPCAST_OPTIONS = HandlerOptions("upcasting", {"upcasters": None}, _check)


def upcasters_of(handler: Handler | None) -> Upcasters | None:
    return handler.options.get("upcasters") if handler is not None else None


class Upcasting(Middleware):
    """Hands each handler an event's arguments in the version it takes (installed by every app: a handler without
    upcasters still meets events of later versions)."""

    @classmethod
    def for_service(cls, settings: Settings, handlers: Sequence[Handler], version: str) -> Upcasting | None:
        return cls()

    def before_handle(self, attempt: Attempt) -> Outcome | None:
        handler, delivery = attempt.handler, attempt.delivery
        fired_at = delivery.headers.get(EVENT_VERSION) or 1
        if handler is None or (fired_at == 1 and not upcasters_of(handler)):
            return None
        try:
            kwargs = as_handled(handler, fired_at, delivery.kwargs)
        except UpcastFailed as exc:
            handling = attempt.context.handling(handler)
            return decide(delivery, CannotRun(Reason.BAD_ARGUMENTS, exc), handling, attempt.context.now())
        if kwargs != delivery.kwargs:
            attempt.arguments = kwargs
        return None
