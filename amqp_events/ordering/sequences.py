"""Parked sequences: what becomes of an ordered handler's message when its key is parked. Pure logic.

A key is *parked* when one of its events (the *head*) was archived: its
later events wait, in order, until the head is replayed and handled, or
discarded. Then they are *released*: sent back to their partition in their
order, marked with the head they waited behind, the last one marked last.
When the last one ran, the key goes on (or, if more events were parked
meanwhile, they are released next).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from amqp_events.wire.parking import RELEASE_PARKED, RELEASED_BEHIND, RELEASED_LAST


@dataclass
class Sequence:
    """A parked key: the event it waits for, and how many of its events wait in the parked queue."""

    head: str
    parked: int = 0
    #: The place the key's next message in the parked queue gets (``parked_seq``).
    next_seq: int = 0

    def take_seq(self) -> int:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        return seq


class Action(Enum):
    """What to do with a message of a key, given the key's parked sequence (if any)."""

    #: Run it as usual.
    RUN = "run"
    #: Run it: it is the head (replayed); when it is handled, release what waits behind it.
    RUN_HEAD = "run_head"
    #: Run it: it is the last one released; when it is handled, the key goes on.
    RUN_LAST = "run_last"
    #: Do not run it: append it to the parked queue.
    PARK = "park"
    #: A command: release what waits behind the head (the head was discarded).
    RELEASE = "release"
    #: A command about a head its key no longer waits for: nothing to do.
    DROP = "drop"


def decide(sequence: Sequence | None, event_id: str, headers: Mapping[str, Any]) -> Action:
    """What to do with a message (its event id and headers) of a key parked as ``sequence`` (or not parked)."""
    release = headers.get(RELEASE_PARKED)
    if release is not None:
        return Action.RELEASE if sequence is not None and sequence.head == release else Action.DROP
    last = Action.RUN_LAST if headers.get(RELEASED_LAST) else Action.RUN
    if sequence is None:
        return last
    if sequence.head in (event_id, headers.get("replay_of")):
        return Action.RUN_HEAD
    if headers.get(RELEASED_BEHIND) == sequence.head:
        return last
    return Action.PARK
