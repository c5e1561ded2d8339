"""Where this user's development brokers run, so that ``amqp-events`` run from any directory finds them.

``amqp-events broker start`` keeps its node in a directory of the current one
(``.amqp-events/broker``); a console, ``topology check`` or ``broker status``
run from elsewhere would not know where to look. Each node started so leaves a
note named after its AMQP port in the user's cache (the directory it runs in);
a note whose node no longer runs is ignored and removed.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def notes_directory() -> Path:
    """``$XDG_CACHE_HOME/amqp-events/running`` (``~/.cache/...`` by default)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "amqp-events" / "running"


def remember(amqp_port: int, directory: Path) -> None:
    """A node serving ``amqp_port`` runs in ``directory``."""
    notes = notes_directory()
    notes.mkdir(parents=True, exist_ok=True)
    (notes / str(amqp_port)).write_text(str(directory.resolve()))


def forget(amqp_port: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        (notes_directory() / str(amqp_port)).unlink()


def noted() -> dict[int, Path]:
    """The directories of the nodes noted as running, by AMQP port (whether they still run is not checked)."""
    notes = notes_directory()
    if not notes.is_dir():
        return {}
    return {int(note.name): Path(note.read_text().strip()) for note in notes.iterdir() if note.name.isdigit()}
