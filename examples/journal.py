"""Where the example handlers note what they did, so that the demo can show who handled what."""

import json
import os
import time

from amqp_events import current_event


def note(service: str, outcome: str, **details: object) -> None:
    path = os.environ.get("DEMO_JOURNAL")
    if not path:
        return
    event = current_event()
    line = {"service": service, "event": event.name, "id": event.id, "attempt": event.attempt, "outcome": outcome}
    with open(path, "a") as journal:  # one write per line with O_APPEND: lines never interleave
        journal.write(json.dumps({**line, **details, "time": time.time()}) + "\n")
