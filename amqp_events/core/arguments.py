"""An event's arguments as they travel: by name, JSON, and of the plain type its function declares.

By name, because a consumer's handler may list the parameters in another order
than the producer's event (positions would swap them silently). Checked before
publishing, because a value the consumer cannot take would otherwise be found
out only there, as an archived event. Pure: nothing here talks to a broker.
"""

from __future__ import annotations

import inspect
from typing import Any

from amqp_events.wire.message import json_body

#: Values JSON carries as they are.
SCALARS = (str, int, float, bool, type(None))
#: The annotations checked, by the type and by its name (``from __future__ import annotations`` keeps names).
PLAIN: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "list": (list, tuple),
    "dict": (dict,),
}


def by_name(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """``args`` and ``kwargs`` of a call of a function of ``signature``, all by name; ``None`` when ``*args``
    took values (they have no names)."""
    named: dict[str, Any] = {}
    for parameter, value in signature.bind(*args, **kwargs).arguments.items():
        kind = signature.parameters[parameter].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                return None
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[parameter] = value
    return named


def check_arguments(event: str, signature: inspect.Signature, named: dict[str, Any]) -> None:
    """Refuse (``TypeError``) a value that JSON cannot carry, or that contradicts a plain annotation of the
    event's function (``int``, ``float``, ``str``, ``bool``, ``list``, ``dict``; others are not checked)."""
    parameters = signature.parameters
    for name, value in named.items():
        parameter = parameters.get(name)
        wanted = _plain(parameter.annotation) if parameter is not None else None
        if wanted is not None and not _fits(value, wanted):
            raise TypeError(
                f"event {event!r}: {name}={_short(value)} is not {_type_name(wanted)} (its parameter says so)"
            )
        if type(value) in SCALARS:  # JSON carries these as they are: no trial encoding on the hot path
            continue
        try:
            json_body(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"event {event!r}: {name}={_short(value)} cannot travel as JSON ({exc})") from None


def _plain(annotation: Any) -> tuple[type, ...] | None:
    if isinstance(annotation, str):
        return PLAIN.get(annotation)
    return PLAIN.get(annotation.__name__) if annotation in (int, float, str, bool, list, dict) else None


def _fits(value: Any, wanted: tuple[type, ...]) -> bool:
    # A bool is an int to Python, never to JSON's reader on the other side.
    return isinstance(value, wanted) and (bool in wanted or not isinstance(value, bool))


def _type_name(wanted: tuple[type, ...]) -> str:
    return {int: "an int", float: "a float", str: "a str", bool: "a bool", list: "a list", dict: "a dict"}[wanted[-1]]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"
