"""The breakers' handler options: ``breaker=`` (its policy) and ``requires=`` (the health checks it needs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from amqp_events.breakers.breaker import BreakerPolicy
from amqp_events.core.handler import Handler
from amqp_events.core.options import HandlerOptions


def _check(handler: Handler, options: Mapping[str, Any]) -> Mapping[str, Any]:
    breaker, requires = options["breaker"], options["requires"]
    if not isinstance(breaker, bool | Mapping | BreakerPolicy | None):
        raise TypeError(f"{handler.name}: breaker= takes a BreakerPolicy, a dict of its fields, True or False")
    if isinstance(breaker, Mapping):
        BreakerPolicy.of(breaker, None)  # its fields' names and values are checked now, not at the worker's start
    if isinstance(requires, str) or not all(isinstance(name, str) for name in requires):
        raise TypeError(f"{handler.name}: requires= takes the names of health checks, e.g. ['payments-api']")
    return {}


class BreakerOptions(TypedDict, total=False):
    """``@app.handler``'s options of the breakers."""

    #: A :class:`~amqp_events.BreakerPolicy`, a dict of its fields, True or False (default: the app's).
    breaker: BreakerPolicy | Mapping[str, Any] | bool | None
    #: Health checks (:meth:`~amqp_events.celery.EventsApp.health_check`) that pause the handler while unhealthy.
    requires: Sequence[str]


BREAKER_OPTIONS = HandlerOptions("breakers", {"breaker": None, "requires": ()}, _check)


def breaker_option(handler: Handler) -> Any:
    """Its ``breaker=``: a policy, a dict of policy fields, True/False, or None for the app's default."""
    return handler.options.get("breaker")


def required_checks(handler: Handler) -> tuple[str, ...]:
    """The names of the health checks it requires (``requires=``)."""
    return tuple(handler.options.get("requires", ()))
