"""Rate limits as written (``"50/m"``, ``"10/s,100000/d"``): a number of starts per window. Pure."""

from __future__ import annotations

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
