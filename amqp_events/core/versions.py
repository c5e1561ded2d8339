"""The versions of an event's arguments: an earlier version's keyword arguments turned into a later one's by a
handler's upcasters, one version at a time. The upcasting middleware runs it before a handler; ``contracts check
--against`` judges the messages at rest by it. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

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
