"""Fire ``bench.noop`` N times with celery-amqp-events 0.1.0 (its only way: one confirmed publish each).

The producer is an app of its own: 0.1.0 cannot fire an event from an app
that also registered its handler (on Celery 5.6+, ``Signature(task_type=...)``
collides with an argument of ``Task.apply_async``). Prints {"rate": events/s};
with ``--last`` the last event carries ``last=True``.
"""

import json
import os
import sys
import time

from amqp_events.celery import events_app

app = events_app("legacy-producer", broker_url=os.environ["BROKER_URL"])


@app.event("bench.noop")
def noop_event(n, last=False):
    pass


count = int(sys.argv[1])
mark_last = "--last" in sys.argv
noop_event(-1)  # connect and warm up (n=-1 is no benchmark mark)
started = time.perf_counter()
for n in range(count):
    noop_event(n, last=mark_last and n == count - 1)
elapsed = time.perf_counter() - started
app.close()
print(json.dumps({"rate": count / elapsed}))
