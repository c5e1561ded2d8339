"""Upcasting: a handler that takes version N of an event's arguments is handed an event fired at an earlier version
turned into version N first, by functions it names, as Axon and EventStore upcast stored events.

``@app.handler(event, upcasters={1: v1_to_v2, 2: v2_to_v3})`` takes version 3. An event fired at version 1 (or
without an ``event_version`` header: every release before versions) goes through both functions, one fired at
version 2 through the second. Each is given the keyword arguments (a dict of its own) and returns those of the
next version. What waits on the broker stays as it was fired, so live events, retries, and replays from the
archive and from the history are each upcast when they run; a retry's copy carries the upcast arguments and their
version. An event at a version the handler has no function from (a later one) reaches it as it was fired.

The version is the sender's word (a header): it picks which of the handler's own functions run, never what
handler runs. An upcaster that raises archives the event (``bad_arguments``, saying which step failed): it can
be replayed once the function is fixed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypedDict

from amqp_events.core.context import Attempt, Middleware
from amqp_events.core.handler import Handler
from amqp_events.core.options import HandlerOptions
from amqp_events.core.outcome import CannotRun, Outcome, decide
from amqp_events.core.versions import Upcasters, UpcastFailed, upcast
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


def handled_version(handler: Handler) -> int:
    """The version of the event's arguments ``handler`` takes: the one after its last upcaster's (else 1)."""
    upcasters = upcasters_of(handler)
    return max(upcasters) + 1 if upcasters else 1


class Upcasting(Middleware):
    """Installed by an app when one of its handlers names upcasters."""

    @classmethod
    def for_service(cls, settings: Settings, handlers: Sequence[Handler], version: str) -> Upcasting | None:
        return cls() if any(upcasters_of(handler) for handler in handlers) else None

    def before_handle(self, attempt: Attempt) -> Outcome | None:
        upcasters = upcasters_of(attempt.handler)
        if not upcasters:
            return None
        delivery = attempt.delivery
        fired_at = delivery.headers.get(EVENT_VERSION) or 1
        try:
            kwargs, version = upcast(upcasters, fired_at, delivery.kwargs)
        except UpcastFailed as exc:
            handling = attempt.context.handling(attempt.handler)
            return decide(delivery, CannotRun(Reason.BAD_ARGUMENTS, exc), handling, attempt.context.now())
        if version != fired_at:
            attempt.delivery = replace(delivery, kwargs=kwargs, headers={**delivery.headers, EVENT_VERSION: version})
        return None
