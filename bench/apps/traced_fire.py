"""Fire ``N`` events one at a time (each confirmed) in the tracing mode ``TRACING``; print events/s."""

import sys
import time

import tracing_mode  # before the library
from ours import app

from amqp_events.middleware import tracing


@app.event("bench.noop")
def noop(n: int, last: bool = False) -> None:
    if n < 0:
        raise ValueError("n must be >= 0")


count = int(sys.argv[1])
assert tracing.enabled() == (tracing_mode.MODE in ("on", "sampled"))
for n in range(200):  # warm up: connected, declared
    noop(n)
started = time.perf_counter()
for n in range(count):
    noop(n)
print(count / (time.perf_counter() - started))
app.close()
