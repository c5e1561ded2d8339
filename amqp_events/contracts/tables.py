"""The reports' Markdown tables (``contracts check``): one row per finding, cells escaped."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(headings: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table of ``rows`` under ``headings``; a ``|`` in a cell is escaped."""
    lines = ["| " + " | ".join(headings) + " |", "|" + "---|" * len(headings)]
    lines.extend("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows)
    return "\n".join(lines) + "\n"
