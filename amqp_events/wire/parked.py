"""The headers of parked sequences of ordered handlers (:mod:`amqp_events.ordering.parking`).

When an ordered handler's event is archived, its key is *parked*: the later
events of that key wait in the partition's parked queue until an operator
replays the archived event (the *head*) or discards it.
"""

from __future__ import annotations

#: On an archived copy: the head of a parked sequence; the key it parks.
PARKS_KEY = "parks_key"
#: On the marker message of a parked key in a parked queue: the head's event id.
PARKED_HEAD = "parked_head"
#: On a message of a parked queue: its place among its key's (reading a quorum queue without consuming it, by
#: taking every message and giving them back, does not keep their order).
PARKED_SEQ = "parked_seq"
#: On a parked event sent back to its partition: the id of the head it waited behind.
RELEASED_BEHIND = "released_behind"
#: On the last event of a release: once it ran, the key goes on (or the next release starts).
RELEASED_LAST = "released_last"
#: On a command to a partition: release the events parked behind this head without running it (the head
#: was discarded from the archive).
RELEASE_PARKED = "release_parked"

#: On a copy of an event a history replay sent (:mod:`amqp_events.history`): the replay's gate.
HISTORY_REPLAY = "history_replay"
#: On a command to a partition: from here on, hold the events that did not come from this history replay (the
#: value, its gate) until the replay is done (``release_parked`` with the same value): they wait in the parked
#: queue, behind the replay's gate, so that no key's live event runs before its replayed past.
HOLD_LIVE = "hold_live"
#: On a message of a parked queue: it waits behind a replay's gate (the value), not behind an archived event.
HELD_LIVE = "held_live"

#: Headers that belong to one copy of a message, never to its retries, replays or archived copies.
PARKING_HEADERS = (
    PARKS_KEY,
    PARKED_HEAD,
    PARKED_SEQ,
    RELEASED_BEHIND,
    RELEASED_LAST,
    RELEASE_PARKED,
    HOLD_LIVE,
    HELD_LIVE,
)
