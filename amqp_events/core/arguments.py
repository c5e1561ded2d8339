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


class Arguments:
    """The arguments of a function of ``signature`` as they travel, worked out once per function: firing
    one event takes a few microseconds here, not :meth:`inspect.Signature.bind`'s tens."""

    def __init__(self, signature: inspect.Signature) -> None:
        self.signature = signature
        parameters = signature.parameters.values()
        kinds = {parameter.kind for parameter in parameters}
        #: Without ``*args`` or positional-only parameters, a call's names are its parameters' (or ``**``'s).
        self._simple = not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY}
        self._positional = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        #: The parameters' names in their order: a call's arguments travel in it, as ``bind`` gives them.
        self._order = [p.name for p in parameters if p.kind not in _VARIADIC]
        self._names = frozenset(self._order)
        self._any_name = inspect.Parameter.VAR_KEYWORD in kinds
        self._required = frozenset(p.name for p in parameters if p.kind not in _VARIADIC and p.default is p.empty)
        #: The plain types each annotated parameter takes.
        self._wanted = {p.name: wanted for p in parameters if (wanted := _plain(p.annotation)) is not None}

    def by_name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """``args`` and ``kwargs`` of a call, all by name; ``None`` when ``*args`` took values (they have no
        names). A call the function cannot take raises ``TypeError``, as calling it would."""
        if self._simple and len(args) <= len(self._positional):
            named = dict(zip(self._positional, args, strict=False))
            if kwargs and (not kwargs.keys().isdisjoint(named) or not (self._any_name or kwargs.keys() <= self._names)):
                return self._bound(args, kwargs)  # a name given twice, or unknown: bind says which
            named.update(kwargs)
            if self._required <= named.keys():
                return self._in_order(named) if kwargs else named
        return self._bound(args, kwargs)

    def _in_order(self, named: dict[str, Any]) -> dict[str, Any]:
        """``named`` in the parameters' order, names only ``**`` takes last (as they were given)."""
        ordered = {name: named[name] for name in self._order if name in named}
        ordered.update((name, value) for name, value in named.items() if name not in self._names)
        return ordered

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        named: dict[str, Any] = {}
        parameters = self.signature.parameters
        for parameter, value in self.signature.bind(*args, **kwargs).arguments.items():
            kind = parameters[parameter].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    return None
            elif kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
            else:
                named[parameter] = value
        return named

    def check(self, event: str, named: dict[str, Any]) -> None:
        """Refuse (``TypeError``) a value that JSON cannot carry, or that contradicts a plain annotation of the
        event's function (``int``, ``float``, ``str``, ``bool``, ``list``, ``dict``; others are not checked)."""
        for name, value in named.items():
            wanted = self._wanted.get(name)
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


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


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
