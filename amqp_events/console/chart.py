"""A small line chart as inline SVG (no JavaScript, no chart library). Pure: no I/O."""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime, timezone

from amqp_events.console.discovery import Series

WIDTH, HEIGHT, MARGIN = 640, 160, 28


@dataclass(frozen=True)
class Line:
    label: str
    series: Series
    colour: str


def svg(lines: list[Line], title: str) -> str:
    """The lines on one time axis, each scaled to its own maximum (labelled), with the time span below."""
    title = html.escape(title)
    moments = [moment for line in lines for moment, _ in line.series]
    if not moments:
        return (
            f'<svg class="chart" role="img" aria-label="{title}: no samples yet" width="{WIDTH}" height="24">'
            f'<text x="{MARGIN}" y="16">{title}: no samples yet</text></svg>'
        )
    start, end = min(moments), max(moments)
    span = max(end - start, 1.0)
    parts = [f'<svg class="chart" role="img" aria-label="{title}" width="{WIDTH}" height="{HEIGHT}">']
    for index, line in enumerate(lines):
        highest = max((value for _, value in line.series), default=0.0)
        top = highest or 1.0
        points = " ".join(
            f"{MARGIN + (moment - start) / span * (WIDTH - 2 * MARGIN):.1f},"
            f"{HEIGHT - MARGIN - value / top * (HEIGHT - 2 * MARGIN):.1f}"
            for moment, value in line.series
        )
        parts.append(
            f'<polyline class="line" data-label="{line.label}" fill="none" stroke="{line.colour}" '
            f'stroke-width="2" points="{points}"/>'
        )
        parts.append(
            f'<text x="{MARGIN + index * 220}" y="14" fill="{line.colour}">{line.label} (max {highest:g})</text>'
        )
    parts.append(f'<text x="{MARGIN}" y="{HEIGHT - 6}">{_clock(start)}</text>')
    parts.append(f'<text x="{WIDTH - MARGIN}" y="{HEIGHT - 6}" text-anchor="end">{_clock(end)} UTC</text>')
    parts.append("</svg>")
    return "".join(parts)


def _clock(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).strftime("%H:%M")
