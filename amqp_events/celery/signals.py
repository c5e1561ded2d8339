"""Signals the library sends, made like Celery's own (``celery.signals``).

Connect a receiver with ``@outcome_settled.connect``; it runs in the process
that settled the message (a pool process, or the worker's main process), and
an exception it raises is logged, never passed on.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

from amqp_events.core.context import Attempt, Middleware
from amqp_events.core.outcome import Outcome

#: A message's outcome was carried out: its handler returned (or was skipped as a duplicate), or its copy
#: (a retry, a redelivery, the archived copy) was confirmed by the broker. Sent before the original is acked,
#: with ``sender`` the service's name and the keyword arguments ``delivery``
#: (:class:`amqp_events.core.delivery.Delivery`), ``outcome`` (``Ack``, ``Redeliver`` or ``SendToArchive``)
#: and ``handling`` (:class:`amqp_events.core.outcome.Handling`: the handler's name and rules).
outcome_settled = Signal(name="amqp_events.outcome_settled", providing_args={"delivery", "outcome", "handling"})


class SettledSignal(Middleware):
    """Sends :data:`outcome_settled` for every settled outcome (every app has it)."""

    def after_handle(self, attempt: Attempt, outcome: Outcome | None, error: BaseException | None) -> None:
        if outcome is not None and outcome_settled.receivers:
            context = attempt.context
            outcome_settled.send(
                sender=context.name, delivery=attempt.delivery, outcome=outcome,
                handling=context.handling(attempt.handler),
            )  # fmt: skip
