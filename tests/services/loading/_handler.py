"""The handler every loading app registers: it records the run."""

from services.behaviour import record


def on_ping(tag: str) -> None:
    record("loaded", tag=tag)
