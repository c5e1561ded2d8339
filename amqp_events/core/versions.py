"""The versions of an event's arguments, as a handler takes them: an earlier version's keyword arguments turned into
the handler's version by its upcasters, one version at a time; a later version's without the arguments the handler
does not take (it reads what it knows of a newer event, as a tolerant reader does). The upcasting middleware runs it
before a handler; ``contracts check --against`` judges the messages at rest by it. Pure."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from amqp_events.core.handler import Handler
from amqp_events.core.publishing import describe
from amqp_events.errors import BadArguments

#: From each version, the function that turns its keyword arguments into the next version's.
Upcasters = Mapping[int, Callable[[dict[str, Any]], Mapping[str, Any]]]


class UpcastFailed(BadArguments):
    """An upcaster raised, or did not return the next version's keyword arguments."""


def upcast(upcasters: Upcasters, version: int, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """``kwargs`` of ``version`` turned into the version after the last of ``upcasters``, and that version (from a
    version none of them takes, as they are); :class:`UpcastFailed` says which step failed."""
    arguments = dict(kwargs)
    while version in upcasters:
        try:
            made = upcasters[version](dict(arguments))
            if not isinstance(made, Mapping):
                raise TypeError(f"it returned {type(made).__name__}, not the keyword arguments")
        except Exception as exc:
            raise UpcastFailed(f"upcasting from version {version} to {version + 1} failed: {describe(exc)}") from exc
        arguments, version = dict(made), version + 1
    return arguments, version


def handled_version(handler: Handler) -> int:
    """The version of the event's arguments ``handler`` takes: the one after its last upcaster's (else 1)."""
    upcasters = handler.options.get("upcasters")
    return max(upcasters) + 1 if upcasters else 1


def as_handled(handler: Handler, version: int, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of an event fired at ``version`` as ``handler`` takes them: an earlier version's
    through its upcasters (:class:`UpcastFailed` names a failed step), a later version's without the arguments it
    does not take (one it requires and does not get is still missing), its own version's as they are."""
    if version > handled_version(handler):
        taken = taken_names(handler)
        return dict(kwargs) if taken is None else {name: value for name, value in kwargs.items() if name in taken}
    return upcast(handler.options.get("upcasters") or {}, version, kwargs)[0]


def taken_names(handler: Handler) -> frozenset[str] | None:
    """The names of the keyword arguments ``handler`` takes (``None``: any, it has ``**kwargs``)."""
    if handler.event_class is None and any(
        parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in handler.signature.parameters.values()
    ):
        return None
    return frozenset(handler.argument_names)
