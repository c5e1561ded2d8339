"""The soak's services (bench/soak.py): ``SERVICE`` handles ``soak.tick``; one event in a hundred fails its first
attempt (a retry through the delay ladder). Each run that succeeds appends its event's number (4 bytes) to a file
of its process, written at once: a process that dies loses nothing it had recorded."""

import os
import struct

from amqp_events import current_event
from amqp_events.celery import events_app

app = events_app(
    os.environ["SERVICE"],
    broker_url=os.environ["BROKER_URL"],
    amqp_events_backoff_base=1,  # a failed first attempt waits 1 s on the ladder
    amqp_events_backoff_max=1,
)
_handled: dict[int, object] = {}


def _record(n: int) -> None:
    out = _handled.get(os.getpid())
    if out is None:  # one file per process (the pool forks after import)
        path = os.path.join(os.environ["SOAK_DIR"], f"{app.service}-{os.getpid()}.bin")
        out = _handled[os.getpid()] = open(path, "ab", buffering=0)  # noqa: SIM115  # for the process's life
    out.write(struct.pack("<I", n))  # type: ignore[attr-defined]


@app.handler("soak.tick")
def on_tick(n: int) -> None:
    if n % 100 == 0 and current_event().attempt == 1:
        raise ConnectionError(f"the first attempt of {n} fails")
    _record(n)
