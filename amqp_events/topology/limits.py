"""Where flow control counts on the broker (:mod:`amqp_events.limits`), as names and queue values. Pure.

* A run's *lease*: ``<service>.limit.<task>[.key.<bucket>].run.<n>``, an exclusive queue of the connection of the
  process that runs it, for ``n`` below the limit; the broker deletes it when that connection ends.
* A window of starts: ``<service>.limit.<task>[.key.<bucket>].<count>per<seconds>s`` (or ``...per<ms>ms``), a durable
  classic queue of at most ``count`` bytes of persistent messages that each live that long (and slacks:
  :func:`start_slack_ms`),
  refusing more (``x-overflow: reject-publish``): a start is a byte of a message it took, and a process may take
  several in one message, to use within a slack (:class:`Window`). Reached through the service's direct
  exchange, by its name. A key's window is deleted once unused for a while (``x-expires``): by then every start it
  counted has expired.
* The limits an operator set at run time (``amqp-events limits set``): ``<service>.limits``, a stream whose messages
  are each the whole table, the last one in force (:mod:`amqp_events.limits.overrides`). Declared by the first
  ``limits set``; every worker reads it from its last message on and follows it.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

from kombu import Exchange, Queue

from amqp_events.topology.names import check_service_name, direct_exchange_name

#: A key's window is deleted when unused this long past its own length (a worker declares it again meanwhile).
KEY_WINDOW_GRACE = 60


def limit_prefix(service: str, task: str, key: str | None = None, buckets: int = 256) -> str:
    """The start of the names of ``task``'s leases and windows (``key``: of one key's, in its canonical form). Keys
    share ``buckets`` sets of them (``amqp_events_limit_keys``): however many keys senders choose, a handler has at
    most that many windows on the broker; two keys of one bucket share its limit (never more is allowed)."""
    prefix = f"{check_service_name(service)}.limit.{task}"
    if key is None:
        return prefix
    return f"{prefix}.key.{bucket_of(key, buckets)}"


def bucket_of(key: str, buckets: int) -> int:
    """The bucket of a canonical key: the same in every worker (CRC-32, as an event's slot)."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % buckets


@functools.lru_cache(maxsize=4096)  # asked for each run of a limited handler: its names are made once
def lease_names(prefix: str, concurrency: int) -> tuple[str, ...]:
    """The leases a run may hold: one of them each."""
    return tuple(f"{prefix}.run.{n}" for n in range(concurrency))


#: The most starts of one window a process takes in one round trip.
MOST_AHEAD = 64
#: A process takes at most this share (one in ...) of a window's starts ahead.
AHEAD_SHARE = 16


def start_slack_ms(millis: int, paced: bool = False, count: int = 0) -> int:
    """How much longer than its window a start is counted: a handler begins a moment after the broker counted its
    start (the rest of the pipeline, a loaded machine), and a start counted that much longer still holds its place
    while another is counted a whole window after it began; a process uses starts it took ahead within it. A
    fiftieth of the window, at most a second. A paced window (:func:`~amqp_events.limits.rates.allowances`) too
    small to take starts ahead, a hundredth: it spreads a longer rate, whose count a start counted a hundredth of
    its spacing longer keeps exact however late its run begins within the spacing, and of which it leaves less
    unused."""
    return millis // 100 if paced and count < 2 * AHEAD_SHARE else min(1000, millis // 50)


#: A start, as counted by a window (the length of its messages' bodies).
START = b"s"


@dataclass(frozen=True)
class Window:
    """The queue that counts one window's starts (at most ``count``), and how a process may take them ahead of its
    runs: up to ``most_ahead`` in one round trip, each to be used within ``ahead_seconds`` of when it was asked for
    (a start taken ahead lives that much longer in the queue, so it is still counted a whole window after its run
    began). ``lasts``: seconds a start is counted (when the window has room again after this process's start)."""

    queue: Queue
    count: int
    most_ahead: int
    ahead_seconds: float
    lasts: float


@functools.lru_cache(maxsize=4096)  # likewise (a worker binds the queue it is given to a channel of its own)
def window(prefix: str, count: int, millis: int, keyed: bool, paced: bool = False) -> Window:
    """The window of at most ``count`` starts in any ``millis`` milliseconds; ``keyed``: one key's, deleted when
    unused; ``paced``: it spreads a longer rate (:func:`start_slack_ms`).

    A process takes starts ahead only from a window large enough that they are a small share of it (a
    sixteenth): a start it took and did not use is counted all the same."""
    most_ahead = min(MOST_AHEAD, max(1, count // AHEAD_SHARE))
    slack = start_slack_ms(millis, paced, count)
    queue = _window_queue(prefix, count, millis, keyed, millis + 2 * slack)
    return Window(queue, count, most_ahead, slack / 1000, (millis + 2 * slack) / 1000)


def _window_queue(prefix: str, count: int, millis: int, keyed: bool, ttl: int) -> Queue:
    name = f"{prefix}.{count}per{millis // 1000}s" if millis % 1000 == 0 else f"{prefix}.{count}per{millis}ms"
    # A classic queue: one process takes its messages one at a time, so the length limit holds exactly (a quorum
    # queue learns it is full only after the message that fills it past its limit, and lets one more in).
    arguments: dict[str, object] = {
        "x-queue-type": "classic",
        "x-max-length-bytes": count,
        "x-overflow": "reject-publish",
        # A slack for the handler to begin, and one for a start taken ahead to be used (Window.lasts).
        "x-message-ttl": ttl,
    }
    if keyed:
        arguments["x-expires"] = 2 * millis + KEY_WINDOW_GRACE * 1000
    service = prefix.partition(".")[0]
    direct = Exchange(direct_exchange_name(service), "direct", durable=True, auto_delete=False)
    return Queue(name, exchange=direct, routing_key=name, durable=True, auto_delete=False, queue_arguments=arguments)


def redeclare_every(queue: Queue) -> float:
    """Seconds within which a worker declares a key's window again, so that it is never deleted while it counts:
    half its ``x-expires`` (a window without one is declared once per connection)."""
    expires = (getattr(queue, "queue_arguments", None) or {}).get("x-expires")
    return float(expires) / 2000 if expires else float("inf")


#: Bytes a service's stream of limits set keeps (each message is the whole table; the last one always stays).
SETTINGS_BYTES = 1_000_000


@functools.lru_cache(maxsize=64)  # asked for each run of a limited handler
def limit_settings(service: str) -> Queue:
    """The stream of ``service``'s limits set at run time, reached through its direct exchange by its name."""
    name = f"{check_service_name(service)}.limits"
    arguments: dict[str, object] = {
        "x-queue-type": "stream",
        "x-max-length-bytes": SETTINGS_BYTES,
        "x-stream-max-segment-size-bytes": SETTINGS_BYTES // 10,
    }
    direct = Exchange(direct_exchange_name(service), "direct", durable=True, auto_delete=False)
    return Queue(name, exchange=direct, routing_key=name, durable=True, auto_delete=False, queue_arguments=arguments)
