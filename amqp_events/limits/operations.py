"""An operator's flow control at run time: the limits in force now, and a change of one handler's, written where
every worker of the service reads it (``amqp-events limits set``, the console, and tests in the in-process mode).
"""

from __future__ import annotations

from collections.abc import Mapping

from amqp_events.core.handler import Handler
from amqp_events.limits.options import Limits, limits_of
from amqp_events.limits.overrides import CONTENT_TYPE, KEEP, Kept, Override, applied, changed, decode, encode
from amqp_events.topology.limits import limit_settings
from amqp_events.transport.base import Transport


def limits_set(transport: Transport, service: str) -> dict[str, Override]:
    """The limits set at run time now; ``ValueError`` when the table cannot be read (it is then not written over)."""
    body = transport.read_limit_table(limit_settings(service).name)
    return decode(body) if body is not None else {}


def in_force(handler: Handler, table: Mapping[str, Override]) -> Limits:
    """``handler``'s limits in force: its row of ``table``, or its code's."""
    return applied(limits_of(handler), table.get(handler.task_name))


def limited_handler(handlers: Mapping[str, Handler], name: str) -> Handler:
    """The one handler with a limit in its code that an operator calls ``name``; ``LookupError`` says why not."""
    matched = [found for _, found in sorted(handlers.items()) if found.known_as(name)]
    if not matched:
        limited = [f"{found.short_name} ({found.event})" for _, found in sorted(handlers.items()) if limits_of(found)]
        which = f"those with a limit in their code: {', '.join(limited)}" if limited else "none has a limit in its code"
        raise LookupError(f"no handler is called {name!r}; {which}")
    if len(matched) > 1:
        raise LookupError(
            f"{name!r} names {len(matched)} handlers ({', '.join(found.task_name for found in matched)}): "
            "name one by its function's name or its full name"
        )
    if not limits_of(matched[0]):
        raise LookupError(
            f"{matched[0].name} has no limit in its code: flow control runs for handlers given concurrency= or "
            "rate_limit="
        )
    return matched[0]


def set_limit(
    transport: Transport,
    service: str,
    handler: Handler,
    concurrency: int | Kept | None = KEEP,
    rate_limit: str | Kept | None = KEEP,
    reset: bool = False,
) -> Limits:
    """Set ``handler``'s limits in force in every worker of ``service`` (``None``: no such limit; ``reset``: its
    code's again); returns them. ``ValueError`` for a limit that is not one."""
    task, table = handler.task_name, limits_set(transport, service)
    row = None if reset else changed(table, task, limits_of(handler), concurrency, rate_limit)
    return in_force(handler, set_row(transport, service, task, row, table))


def set_row(
    transport: Transport, service: str, task: str, row: Override | None, table: dict[str, Override] | None = None
) -> dict[str, Override]:
    """Write ``task``'s row of the table of limits set at run time (``None``: remove it, its code's limits in force
    again) into ``table`` (read now if not given); returns the table written. Workers apply a row to a handler that
    has a limit in its code."""
    table = limits_set(transport, service) if table is None else table
    if row is None:
        table.pop(task, None)
    else:
        table[task] = row
    transport.write_limit_table(limit_settings(service), encode(table), CONTENT_TYPE)
    return table
