"""Timing marks the benchmark handlers write: the first and the last of a run, and every retried attempt."""

import json
import os
import time

MARKS = os.environ.get("MARKS_FILE")


def mark(n, last, attempt=None):
    if MARKS and (n == 0 or last or attempt is not None or os.environ.get("MARK_ALL")):
        with open(MARKS, "a") as out:
            out.write(
                json.dumps({"n": n, "last": last, "attempt": attempt, "time": time.time(), "pid": os.getpid()}) + "\n"
            )
