"""Limits changed at run time (``amqp-events limits set``): a service's table of them, as written to its stream of
limits (:func:`~amqp_events.topology.limits.limit_settings`), and a handler's limits with its row applied. Pure.

Each message of the stream is the whole table, so the last one is all a worker needs. A row gives a handler's
``concurrency`` and ``rate_limit`` in force instead of its code's (``None``: no such limit); its keys stay the
code's. A handler without a row has its code's limits.

The table is read from the broker: a body that is not one is refused whole (``ValueError``) and the worker keeps
the table it had.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, Literal

from amqp_events.limits.options import Limits, concurrency_refusal
from amqp_events.limits.rates import parse_rates

#: What the stream's messages say they are (``content_type``).
CONTENT_TYPE = "application/vnd.amqp-events.limits+json"
#: The largest table read: far above a service's handlers' rows.
MAX_TABLE_BYTES = 256 * 1024


@dataclass(frozen=True)
class Override:
    """One handler's limits set at run time."""

    concurrency: int | None = None
    rate_limit: str | None = None

    def __post_init__(self) -> None:
        wrong = concurrency_refusal(self.concurrency)
        if wrong:
            raise ValueError(f"concurrency{wrong} (or none)")
        if self.rate_limit is not None:
            parse_rates(self.rate_limit)  # ValueError says what is wrong

    def describe(self) -> str:
        """As ``limits show`` prints it."""
        return f"concurrency {self.concurrency or 'none'}; rate limit {self.rate_limit or 'none'}"


Table = Mapping[str, Override]


class _Keep(Enum):
    KEEP = "keep"


#: A limit :func:`changed` leaves as it is in force.
KEEP: Final = _Keep.KEEP
Kept = Literal[_Keep.KEEP]


def written(limits: Limits) -> Override:
    """A handler's limits as a row of the table."""
    return Override(limits.concurrency, ",".join(map(str, limits.rates)) or None)


def changed(
    table: Table,
    task: str,
    code: Limits,
    concurrency: int | Kept | None = KEEP,
    rate_limit: str | Kept | None = KEEP,
) -> Override:
    """``task``'s row with each limit given, the others as they are in force (its row's in ``table``, or its code's
    ``code``). ``ValueError`` for a limit that is not one."""
    now = table.get(task) or written(code)
    return Override(
        now.concurrency if concurrency is KEEP else concurrency,
        now.rate_limit if rate_limit is KEEP else rate_limit,
    )


def encode(table: Table) -> bytes:
    """The table as a message of the stream."""
    rows = {task: dataclasses.asdict(row) for task, row in sorted(table.items())}
    return json.dumps({"handlers": rows}, separators=(",", ":")).encode()


def decode(body: bytes) -> dict[str, Override]:
    """A message of the stream, checked; ``ValueError`` for anything that is not a table of limits."""
    if len(body) > MAX_TABLE_BYTES:
        raise ValueError(f"a table of limits of {len(body)} bytes (at most {MAX_TABLE_BYTES})")
    try:
        found: Any = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a table of limits: {exc}") from None
    rows = found.get("handlers") if isinstance(found, dict) else None
    if not isinstance(rows, dict):
        raise ValueError("not a table of limits: no 'handlers' object")
    table = {}
    for task, row in rows.items():
        if not isinstance(row, dict) or set(row) - {"concurrency", "rate_limit"}:
            raise ValueError(f"the row of {task!r} is not {{'concurrency': ..., 'rate_limit': ...}}")
        if not isinstance(row.get("rate_limit"), (str, type(None))):
            raise ValueError(f"the rate limit of {task!r} is not text")
        try:
            table[task] = Override(row.get("concurrency"), row.get("rate_limit"))
        except ValueError as exc:
            raise ValueError(f"the row of {task!r}: {exc}") from None
    return table


@functools.lru_cache(maxsize=1024)  # asked for each run of a limited handler
def applied(limits: Limits, row: Override | None) -> Limits:
    """``limits`` (a handler's in code) with its row of the table in force instead, if it has one."""
    if row is None:
        return limits
    rates = parse_rates(row.rate_limit) if row.rate_limit is not None else ()
    return dataclasses.replace(limits, concurrency=row.concurrency, rates=rates)
