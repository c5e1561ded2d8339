"""Plain Celery with the same safety settings as celery-amqp-events: the baseline for handler throughput."""

import os
import time

from celery import Celery
from marks import mark

app = Celery("plain", broker=os.environ["BROKER_URL"])
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_acks_on_failure_or_timeout=False,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("PLAIN_QUEUE", "plain"),
    task_default_queue_type=os.environ.get("PLAIN_QUEUE_TYPE", "classic"),
)


#: Seconds the handler waits as on a network call (under -P gevent, time.sleep yields); HOLD: marks, then waits.
IO_WAIT = float(os.environ.get("IO_WAIT") or 0)
HOLD = float(os.environ.get("HOLD") or 0)


@app.task(name="bench.noop")
def noop(n, last=False):
    if HOLD:
        mark(n, last)
        time.sleep(HOLD)
        return
    if IO_WAIT:
        time.sleep(IO_WAIT)
    mark(n, last)


@app.task(name="bench.wait", bind=True)
def wait(self, n, delay):
    mark(n, False, attempt=self.request.retries + 1)
    if self.request.retries == 0:
        raise self.retry(countdown=delay)
