"""The console's event log: every change an operator made through it (who, what, on which service, when).

Each record is logged (logger ``amqp_events.console.audit``), kept in memory
(the newest :data:`KEEP`) for the event log page and ``GET /api/audit``, and,
when the console is given a file (``--audit-file``), appended to it as a JSON
line, from which a restarted console reads its past.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

logger = logging.getLogger("amqp_events.console.audit")
#: Records kept in memory (the file keeps every one).
KEEP = 10_000


@dataclass(frozen=True)
class Record:
    """One change: ``action`` (``replay``, ``purge``, ``edit``, ``pause``, ``resume``) of ``service``."""

    at: str
    who: str
    action: str
    service: str
    #: What it touched, in words: ``3 message(s)``, ``group 1f2e…``, ``handler user.created``.
    target: str
    #: The particulars: ids, the arguments before and after an edit, the workers that paused.
    detail: dict[str, Any] = field(default_factory=dict)

    def matches(self, service: str | None, who: str | None, action: str | None) -> bool:
        return (
            (not service or self.service == service)
            and (not who or who.lower() in self.who.lower())
            and (not action or self.action == action)
        )


#: Every change the console makes, by the word its event log files it under, and how its page says it.
ACTIONS = {
    "replay": "replays",
    "purge": "purges",
    "edit": "edits",
    "pause": "pauses",
    "resume": "resumes",
    "set limits": "limits set",
    "reset limits": "limits reset",
}


class AuditTrail:
    """The records, newest last; written through to ``path`` (JSON lines) when given."""

    def __init__(self, path: Path | None = None, keep: int = KEEP) -> None:
        self.path = path
        self._records: deque[Record] = deque(maxlen=keep)
        self._lock = threading.Lock()
        if path is not None and path.exists():
            self._records.extend(_read(path.read_text("utf-8").splitlines()))

    def record(self, who: str, action: str, service: str, target: str, **detail: Any) -> Record:
        if action not in ACTIONS:  # the page lists the actions it logs: one not listed there is a defect
            raise ValueError(f"not an action of the event log: {action!r}")
        entry = Record(datetime.now(timezone.utc).isoformat(), who, action, service, target, detail)
        logger.warning("%s: %s %s of %s %s", who, action, target, service, json.dumps(detail, default=str))
        with self._lock:
            self._records.append(entry)
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(asdict(entry), default=str) + "\n")
        return entry

    def records(
        self, service: str | None = None, who: str | None = None, action: str | None = None, limit: int = 500
    ) -> list[Record]:
        """The newest ``limit`` records that match, newest first."""
        with self._lock:
            newest_first = list(reversed(self._records))
        return [record for record in newest_first if record.matches(service, who, action)][:limit]


def _read(lines: Iterable[str]) -> Iterable[Record]:
    for line in lines:
        try:
            yield Record(**json.loads(line))
        except (ValueError, TypeError):  # a line cut short by a crash: the others still count
            continue
