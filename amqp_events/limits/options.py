"""Flow control's handler options: ``concurrency=`` (runs at once) and ``rate_limit=`` (runs started per window),
each counted over the whole service, or per key (``concurrency_key=``, ``rate_limit_key=``). Pure.

``rate_limit=`` is Celery's task option too, where it counts per worker process and keeps what waits in the
worker's memory; on a handler it is this one, counted over the fleet, waiting on the broker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from amqp_events.core.handler import Handler, KeyOption, argument_key
from amqp_events.core.options import HandlerOptions
from amqp_events.errors import BadArguments
from amqp_events.limits.rates import Allowance, Rate, allowances, parse_rates
from amqp_events.wire.message import event_key

Key = Callable[[tuple[Any, ...], dict[str, Any]], Any]


@dataclass(frozen=True)
class Limits:
    """A handler's limits, checked: what :class:`~amqp_events.limits.middleware.FlowControl` applies."""

    #: At most this many runs at once (per key, with ``concurrency_key``); ``None``: no bound.
    concurrency: int | None = None
    concurrency_key: Key | None = None
    #: At most ``count`` runs started in any ``seconds``, for each (per key, with ``rate_key``).
    rates: tuple[Rate, ...] = ()
    rate_key: Key | None = None
    #: Starts of the shortest rate that may come at once (1: evenly, one every spacing; its count: a whole window).
    burst: int = 1

    @property
    def windows(self) -> tuple[Allowance, ...]:
        """The windows on the broker that count the rates (:func:`~amqp_events.limits.rates.allowances`)."""
        return allowances(self.rates, self.burst)

    def __bool__(self) -> bool:
        return self.concurrency is not None or bool(self.rates)

    def describe(self) -> str:
        """``concurrency 5 per key, 50/m`` as a log or a page says it."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}{' per key' if self.concurrency_key else ''}")
        if self.rates:
            parts.append(", ".join(map(str, self.rates)) + (" per key" if self.rate_key else ""))
            if self.burst > 1:
                parts.append(f"burst {self.burst}")
        return "; ".join(parts)


def concurrency_refusal(concurrency: Any) -> str | None:
    """Why ``concurrency`` is no limit of runs at once, to follow ``concurrency`` (``None``: it is one, or none is
    set)."""
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)):
        return f"= takes a whole number of runs at once, not {concurrency!r}"
    if concurrency is not None and concurrency < 1:
        return f"={concurrency} must be at least 1"
    return None


def burst_refusal(burst: Any) -> str | None:
    """Why ``burst`` is no number of starts at once (``None``: it is one, or none is given)."""
    if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int) or burst < 1):
        return f"= takes a whole number of starts at once, at least 1, not {burst!r}"
    return None


def _check(handler: Handler, options: Mapping[str, Any]) -> Mapping[str, Any]:
    concurrency, rate_limit, burst = options["concurrency"], options["rate_limit"], options["burst"]
    concurrency_key, rate_key = options["concurrency_key"], options["rate_limit_key"]
    wrong = concurrency_refusal(concurrency)
    if wrong:
        raise TypeError(f"{handler.name}: concurrency{wrong}")
    if burst_refusal(burst):
        raise TypeError(f"{handler.name}: burst{burst_refusal(burst)}")
    if burst is not None and rate_limit is None:
        raise TypeError(f"{handler.name}: burst= needs the rate it lets come at once (rate_limit=)")
    try:
        rates = parse_rates(rate_limit) if rate_limit is not None else ()
    except ValueError as exc:
        raise TypeError(f"{handler.name}: rate_limit={rate_limit!r}: {exc}") from None
    for option, key, limit in (("concurrency_key", concurrency_key, concurrency), ("rate_limit_key", rate_key, rates)):
        if key is not None and not limit:
            raise TypeError(f"{handler.name}: {option}= needs the limit it keys ({option.rpartition('_key')[0]}=)")
    limits = Limits(
        concurrency,
        _key(handler, "concurrency_key", concurrency_key),
        rates,
        _key(handler, "rate_limit_key", rate_key),
        burst or 1,
    )
    if limits and handler.ordered:
        raise TypeError(
            f"{handler.name}: an ordered handler runs one event of a key at a time in its partition; "
            "concurrency= and rate_limit= are for handlers without ordered_by="
        )
    return {"options": {**handler.options, "limits": limits}} if limits else {}


def _key(handler: Handler, option: str, by: KeyOption | None) -> Key | None:
    return None if by is None else argument_key(handler, option, by)


class LimitOptions(TypedDict, total=False):
    """``@app.handler``'s options of flow control (docs/guides/flow-control.md)."""

    #: At most this many runs at once, over every worker of the service (per key, with ``concurrency_key``).
    concurrency: int | None
    #: The name of the event's argument that holds the key concurrency is counted by, or a callable of them.
    concurrency_key: KeyOption | None
    #: At most this many runs started per window, over every worker: ``"50/m"``, ``"10/s,100000/d"``.
    rate_limit: str | None
    #: The key the rate is counted by (an argument's name, or a callable of the arguments).
    rate_limit_key: KeyOption | None
    #: How many starts of the rate may come at once (default 1: evenly, one every 1.2 s at ``"50/m"``).
    burst: int | None


LIMIT_OPTIONS = HandlerOptions(
    "limits",
    {"concurrency": None, "concurrency_key": None, "rate_limit": None, "rate_limit_key": None, "burst": None},
    _check,
)


def limits_of(handler: Handler) -> Limits:
    """``handler``'s limits (empty: none)."""
    found = handler.options.get("limits")
    return found if isinstance(found, Limits) else NO_LIMITS


NO_LIMITS = Limits()


def limit_key(value: Any) -> str:
    """A limit's key in its one canonical form: a string of 1 to 255 characters as it is, an integer written in
    decimal (``42`` and ``"42"`` are one key); anything else (``42.0``, ``[42]``, ``None``) is refused
    (:class:`~amqp_events.errors.BadArguments`: the event is archived, it can never run)."""
    try:
        return event_key(value)
    except ValueError as exc:
        raise BadArguments(f"a limit's key {str(exc).removeprefix('an event key ')}") from None
