"""Commits one transaction with N events in the outbox, prints their ids, then dies (SIGKILL) before any relay ran.

``python outbox_writer.py DATABASE_URL N``
"""

import os
import signal
import sys

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from amqp_events.celery import events_app

app = events_app("writer")
engine = create_engine(sys.argv[1])
with Session(engine) as session, session.begin(), app.outbox(session):
    ids = [app.fire("test.ping", [f"killed-{n}"], {}) for n in range(int(sys.argv[2]))]
print(" ".join(ids), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
