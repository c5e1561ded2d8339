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

from amqp_events.wire.parked import HISTORY_REPLAY, HOLD_LIVE, RELEASE_PARKED, RELEASED_BEHIND, RELEASED_LAST

#: The parked sequence of a partition's replay gate (no key is empty): while a history replay runs, the events
#: that did not come from it wait behind it.
GATE = ""


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
    #: A command carried out (a replay's gate closed or opened): nothing to run.
    DONE = "done"


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


class Gate(Enum):
    """What a partition's replay gate makes of a message, before its key's sequence has a say."""

    #: Close the gate (or move it to another replay): a command.
    HOLD = "hold"
    #: Open the gate: the replay is done, what it held goes on (a command).
    OPEN = "open"
    #: Hold it behind the gate: an event that did not come from the replay.
    WAIT = "wait"
    #: On to its key's decision (no gate, a replayed event, or one the gate let go).
    PASS = "pass"


def through_gate(gate: Sequence | None, headers: Mapping[str, Any]) -> Gate:
    """What the gate ``gate`` (``None``: open) of a partition makes of a message with these headers."""
    if headers.get(HOLD_LIVE) is not None:
        return Gate.HOLD
    if gate is None:
        return Gate.PASS
    if headers.get(RELEASE_PARKED) == gate.head:
        return Gate.OPEN
    passing = (headers.get(HISTORY_REPLAY), headers.get(RELEASED_BEHIND), headers.get(RELEASE_PARKED))
    if gate.head in passing[:2] or passing[2] is not None:  # replayed, let go, or a key's release command
        return Gate.PASS
    return Gate.WAIT


def without_gate_marks(gate: Sequence | None, headers: Mapping[str, Any]) -> Mapping[str, Any]:
    """``headers`` without the marks of the gate's release (what its key's decision reads)."""
    if gate is None or headers.get(RELEASED_BEHIND) != gate.head:
        return headers
    return {name: value for name, value in headers.items() if name not in (RELEASED_BEHIND, RELEASED_LAST)}
