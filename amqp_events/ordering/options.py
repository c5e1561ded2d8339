"""Ordering's handler options: ``ordered_by=`` (where an event's key is) and ``on_archive=`` (``park``: an
archived event holds its key's later events back until it is replayed or discarded; ``skip``: they go on)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypedDict

from amqp_events.core.handler import Handler, argument_key
from amqp_events.core.options import HandlerOptions

#: What an ordered handler's archived event does to the later events of its key.
ON_ARCHIVE = ("park", "skip")


def _check(handler: Handler, options: Mapping[str, Any]) -> Mapping[str, Any]:
    ordered_by, on_archive = options["ordered_by"], options["on_archive"]
    if on_archive not in ON_ARCHIVE:
        raise TypeError(f"{handler.name}: on_archive={on_archive!r} is not one of {', '.join(ON_ARCHIVE)}")
    if ordered_by is None:
        return {}
    return {"key": argument_key(handler, "ordered_by", ordered_by), "parks": on_archive == "park"}


class OrderingOptions(TypedDict, total=False):
    """``@app.handler``'s options of ordered handling (docs/guides/ordering.md)."""

    #: The name of the event's argument that holds its key, or a callable given the arguments.
    ordered_by: str | Callable[..., Any] | None
    #: When an event of a key is archived: its key's later events wait (``park``) or go on (``skip``).
    on_archive: Literal["park", "skip"]


ORDERING_OPTIONS = HandlerOptions("ordering", {"ordered_by": None, "on_archive": "park"}, _check)
