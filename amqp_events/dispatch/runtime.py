"""What a host gives the dispatcher: how a handler runs in it, and the host's own path for a message that needs it.

The dispatcher knows no host. Celery's worker gives it :class:`amqp_events.celery.running.CeleryRuntime` (a
handler runs as Celery's trace would set it up; Celery's request path where something configured relies on it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from amqp_events.core.delivery import Delivery
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Outcome, RejectedByHandler


class Runtime(Protocol):
    #: Does it log each run as the host's own lines do (``received``, ``succeeded``)? Read once.
    logs_runs: bool

    def run(
        self, handler: Handler, delivery: Delivery, delivery_info: Mapping[str, Any], can_hold: bool = False
    ) -> Outcome | RejectedByHandler | None:
        """Run ``handler`` on ``delivery`` through the handling pipeline, here; the outcome settled. ``None``: the
        host's runtime took the run over (Celery's ``Retry`` or ``Ignore``). ``can_hold``: a :class:`Hold` may be
        returned, and the caller runs the message again later."""

    def takes_over(self, handler: Handler) -> bool:
        """Does a message of ``handler`` need the host's own path (:meth:`take_over`) instead of :meth:`run`?"""

    def take_over(self, handler: Handler, message: Any) -> None:
        """Hand ``message`` to the host's own path, which runs and settles it."""

    def received(self, handler: Handler, delivery: Delivery) -> None:
        """Log a run's start, as the host does (with :attr:`logs_runs`)."""

    def succeeded(self, handler: Handler, delivery: Delivery, seconds: float) -> None:
        """Log a run's success, as the host does (with :attr:`logs_runs`)."""
