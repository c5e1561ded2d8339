"""Delay-ladder routing keys: pure, no broker."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from amqp_events.topology import delays


def passes(delay: int) -> list[int]:
    """The ladder levels a message with ``delay`` waits in, as the level exchanges route it."""
    key = delays.routing_key(delay, "queue.x")
    waited = []
    for level in reversed(range(delays.LEVELS)):
        pattern = delays.bit_pattern(level, "1").split(".")
        words = key.split(".")
        if all(p in ("*", "#") or p == w for p, w in zip(pattern[:-1], words, strict=False)):
            waited.append(level)
    return waited


@pytest.mark.parametrize("delay", [0, 1, 2, 3, 5, 16, 1000, 30 * 86400, delays.MAX_DELAY])
def test_a_message_waits_exactly_its_delay(delay):
    assert sum(2**level for level in passes(delay)) == delay


def test_the_routing_key_spells_the_delay_then_the_destination():
    key = delays.routing_key(5, "queue.orders:billing.invoice.paid")
    assert key == "0." * 19 + "1.0.1.queue.orders:billing.invoice.paid"
    assert delays.decode_routing_key(key) == (5, "queue.orders:billing.invoice.paid")


def test_delays_round_up_to_whole_seconds_never_down():
    assert delays.whole_seconds(0.2) == 1
    assert delays.whole_seconds(4.0) == 4
    assert delays.whole_seconds(4.001) == 5


def test_thirty_days_fit_and_the_limit_is_explicit():
    assert delays.whole_seconds(30 * 86400) == 2_592_000
    with pytest.raises(delays.DelayTooLong, match="longest"):
        delays.routing_key(delays.MAX_DELAY + 1, "queue.x")
    with pytest.raises(ValueError):
        delays.whole_seconds(-1)


def test_the_destination_pattern_counts_the_bit_words():
    pattern = delays.destination_pattern("queue.a.b")
    assert pattern.count("*") == delays.LEVELS and pattern.endswith(".queue.a.b")


def test_seconds_until_an_eta():
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert delays.seconds_until(now + timedelta(seconds=90), now) == 90
    assert delays.seconds_until(now - timedelta(seconds=5), now) == 0
    assert delays.seconds_until(datetime(2026, 1, 1, 0, 0, 30), now) == 30  # naive means UTC


@pytest.mark.parametrize("key", ["1.0.queue.x", "0." * 22, "2." + "0." * 21 + "queue.x"])
def test_decoding_rejects_other_keys(key):
    with pytest.raises(ValueError):
        delays.decode_routing_key(key)
