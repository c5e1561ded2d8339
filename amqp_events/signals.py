"""Signals the library sends, made like Celery's own (``celery.signals``).

Connect a receiver with ``@outcome_settled.connect``; it runs in the process
that settled the message (a pool process, or the worker's main process), and
an exception it raises is logged, never passed on.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

#: A message's outcome was carried out: its handler returned (or was skipped as a duplicate), or its copy
#: (a retry, a redelivery, the archived copy) was confirmed by the broker. Sent before the original is acked,
#: with ``sender`` the service's name and the keyword arguments ``delivery``
#: (:class:`amqp_events.outcome.Delivery`), ``outcome`` (``Ack``, ``Redeliver`` or ``Archive``) and
#: ``handling`` (:class:`amqp_events.outcome.Handling`: the handler's name and rules).
outcome_settled = Signal(name="amqp_events.outcome_settled", providing_args={"delivery", "outcome", "handling"})
