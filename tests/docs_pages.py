"""The README and the documentation site's pages, read for the tests that run their examples as written.

A Python block whose first line names a file (``# orders/celery.py``) is an example the tests write out and run;
the same name on two pages must mean the same file.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
_SITE = {str(path.relative_to(ROOT)): path.read_text() for path in sorted((ROOT / "docs").rglob("*.md"))}
#: Files of the root the site's pages include (``docs/benchmarks.md``: ``--8<-- "BENCHMARKS.md"``).
INCLUDED = re.findall(r'^--8<-- "([^"]+)"$', "\n".join(_SITE.values()), flags=re.M)
#: Every page by its path from the root: ``README.md``, ``docs/guides/firing.md``, ``RELIABILITY.md``, ...
PAGES = {
    "README.md": (ROOT / "README.md").read_text(),
    **_SITE,
    **{name: (ROOT / name).read_text() for name in INCLUDED},
}
#: All of them, for what may be said on any page.
ALL_PAGES = "\n".join(PAGES.values())
#: The broker URL the examples are written with, replaced by the test's own.
EXAMPLE_BROKER = "amqp://guest:guest@localhost:5672/"


def page(path: str) -> str:
    """One page: ``page("guides/archive.md")`` (under ``docs/``) or ``page("README.md")``."""
    return PAGES[path if path == "README.md" else f"docs/{path}"]


def named_blocks(language: str = "python", comment: str = "#") -> list[tuple[str, str, str]]:
    """``(page, file name, body)`` of every block of ``language`` whose first line names its file."""
    pattern = rf"```{language}\n{re.escape(comment)} (\S+\.\w+)[^\n]*\n(.*?)```"
    return [(path, name, body) for path, text in PAGES.items() for name, body in re.findall(pattern, text, re.S)]


def code_blocks() -> dict[str, str]:
    """The Python examples by file name (``orders/celery.py``)."""
    return {name: body for _, name, body in named_blocks()}


def write_blocks(directory: Path, broker_url: str, *names: str) -> None:
    """Write the examples ``names`` into ``directory`` (pointed at ``broker_url``), as packages."""
    files = code_blocks()
    for name in names:
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[name].replace(EXAMPLE_BROKER, broker_url))
        if path.parent != directory:
            (path.parent / "__init__.py").touch()
