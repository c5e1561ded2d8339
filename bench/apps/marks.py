"""Timing marks the benchmark handlers write: the first and the last of a run, and every retried attempt."""

import json
import os
import time

MARKS = os.environ.get("MARKS_FILE")
#: Also every event whose number is a multiple of this (steady rates, between two of them).
EVERY = int(os.environ.get("MARK_EVERY") or 0)


def mark(n, last, attempt=None):
    if MARKS and (n == 0 or last or attempt is not None or os.environ.get("MARK_ALL") or (EVERY and n % EVERY == 0)):
        with open(MARKS, "a") as out:
            out.write(
                json.dumps({"n": n, "last": last, "attempt": attempt, "time": time.time(), "pid": os.getpid()}) + "\n"
            )
