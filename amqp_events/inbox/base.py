"""What a handler asks of an inbox or a dedup store (pure: the protocols and the key)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class EffectKey:
    """One effect: this service's handler, for this event."""

    service: str
    handler: str
    event_id: str

    def __str__(self) -> str:
        return f"{self.service}:{self.handler}:{self.event_id}"


class TransactionalInbox(Protocol):
    """The strong form: the key is written in the transaction of the handler's own writes."""

    def transaction(self, key: EffectKey) -> AbstractContextManager[tuple[Any, bool]]:
        """A transaction with ``key`` inserted: ``(handle for the handler, first time?)``.

        It commits when the block ends normally and rolls back when it raises.
        """

    def prune(self, older_than: float, batch: int = 1000) -> int:
        """Delete keys processed before ``older_than`` (epoch seconds), ``batch`` per transaction."""


class DedupStore(Protocol):
    """The weak form: a record of the effects that succeeded."""

    def seen(self, key: EffectKey) -> bool: ...

    def record(self, key: EffectKey) -> None: ...


def effect_stores(handler: Any) -> tuple[TransactionalInbox | None, DedupStore | None]:
    """A handler's inbox and dedup store: its ``inbox=`` and ``dedup=`` options (each may be None)."""
    return handler.options.get("inbox"), handler.options.get("dedup")
