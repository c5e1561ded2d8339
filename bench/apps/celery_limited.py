"""Plain Celery with its own ``rate_limit=`` (per worker process): the baseline of the flow-control accuracy."""

import json
import os
import time

from celery import Celery
from kombu import Queue

app = Celery("celery_limited", broker=os.environ["BROKER_URL"])
app.conf.task_queues = [Queue("celery_limited")]
app.conf.task_default_queue = "celery_limited"
app.conf.task_acks_late = True
MARKS = os.environ.get("MARKS_FILE")


@app.task(name="bench.limited", rate_limit=os.environ.get("RATE"))
def limited(n, last=False):
    with open(MARKS, "a") as out:
        out.write(json.dumps({"handler": "limited", "n": n, "tag": "start", "time": time.time()}) + "\n")
