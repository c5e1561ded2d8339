"""Queue layouts: moving a service's waiting events from one layout to the other
(:mod:`amqp_events.topology.moving` says what changes; :func:`~amqp_events.layouts.move.move_layout` does it)."""

from amqp_events.layouts.move import Moved, move_layout

__all__ = ["Moved", "move_layout"]
