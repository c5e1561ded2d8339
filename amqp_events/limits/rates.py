"""Rate limits as written (``"50/m"``, ``"10/s,100000/d"``): a number of starts per window, and the windows that
count them (:func:`allowances`: the shortest one paced, so that its starts come evenly, ``burst`` at most at once).
Pure."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

#: Seconds per unit: Celery's ``s``, ``m`` and ``h``, and a day.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_ONE = re.compile(r"\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*")


@dataclass(frozen=True, order=True)
class Rate:
    """At most ``count`` runs started in any ``seconds``."""

    count: int
    seconds: int

    def __str__(self) -> str:
        for unit, seconds in sorted(UNITS.items(), key=lambda item: -item[1]):
            if self.seconds % seconds == 0:
                per = self.seconds // seconds
                return f"{self.count}/{per if per > 1 else ''}{unit}"
        return f"{self.count}/{self.seconds}s"  # pragma: no cover (every whole number of seconds has a unit)

    @property
    def spacing(self) -> float:
        """Seconds between two starts when they are spread evenly: how long a refused start waits."""
        return self.seconds / self.count


def parse_rates(written: str) -> tuple[Rate, ...]:
    """``"50/m"`` or several, comma-separated (``"10/s,100000/d"``); a window may be a multiple (``"5/10s"``).
    ``ValueError`` says what is wrong."""
    if not isinstance(written, str) or not written.strip():
        raise ValueError(f"a rate limit is written like '50/m' or '10/s,100000/d', not {written!r}")
    rates = []
    for part in written.split(","):
        match = _ONE.fullmatch(part)
        if match is None:
            raise ValueError(f"{part.strip()!r} is not a rate: write a count per s, m, h or d, like '50/m'")
        count, multiple, unit = int(match[1]), int(match[2] or 1), match[3]
        if count < 1 or multiple < 1:
            raise ValueError(f"{part.strip()!r}: the count and the window must be at least 1")
        rates.append(Rate(count, multiple * UNITS[unit]))
    if len({rate.seconds for rate in rates}) < len(rates):
        raise ValueError(f"{written!r} gives one window twice")
    return tuple(sorted(rates, key=lambda rate: rate.seconds))


#: The grain of an even pace: the shortest rate's starts come at most this many milliseconds' worth at once.
PACE_MILLIS = 1000


@dataclass(frozen=True, order=True)
class Allowance:
    """At most ``count`` starts in any ``millis`` milliseconds: what one window on the broker counts. ``paced``: it
    spreads a longer rate's starts (:func:`allowances`), which a start counted a hundredth longer keeps exact."""

    count: int
    millis: int
    paced: bool = False

    @property
    def spacing(self) -> float:
        """Seconds between two starts when they come evenly."""
        return self.millis / 1000 / self.count


@functools.lru_cache(maxsize=1024)  # asked for each run of a limited handler
def allowances(rates: tuple[Rate, ...], burst: int = 1) -> tuple[Allowance, ...]:
    """The windows that count ``rates``. The shortest is paced: its starts come evenly, a second's worth at most at
    once (``"50/m"``: one in any 1.2 s; ``"600/m"``: ten in any second), or ``burst`` of them if more, so that a
    backlog does not start a whole window's worth at once and then nothing. The longer ones are counted as written
    (``"10/s,100000/d"``: the day's count is a cap over the paced seconds). A rate of a second or less, or a
    ``burst`` of its whole count, is counted as written."""
    found = [Allowance(rate.count, rate.seconds * 1000) for rate in rates]
    if not found:
        return ()
    shortest = found[0]  # parse_rates sorts them by their window
    wanted = max(burst, -(-shortest.count * PACE_MILLIS // shortest.millis))  # a second's worth, rounded up
    if wanted >= shortest.count:
        return tuple(found)
    # Paced by a count that divides the rate's, its window holds whole paces: "3/2s" paced by 2 at a time would let
    # 4 start in some 2 s. When no divisor comes near, the rate as written stays beside the pace, as a cap.
    count = _largest_divisor(shortest.count, wanted)
    if 2 * count >= wanted:
        return (Allowance(count, -(-shortest.millis * count // shortest.count), paced=True), *found[1:])
    return (Allowance(wanted, -(-wanted * shortest.millis // shortest.count), paced=True), *found)


def _largest_divisor(number: int, at_most: int) -> int:
    """The largest divisor of ``number`` that is at most ``at_most``."""
    small = [d for d in range(1, math.isqrt(number) + 1) if number % d == 0]
    return max(d for d in (*small, *(number // d for d in small)) if d <= at_most)
