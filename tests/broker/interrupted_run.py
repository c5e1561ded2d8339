"""Not collected by the suite (its name): ``test_the_test_command.py`` runs it through ``bash scripts/test`` and
interrupts it once its node, worker and PostgreSQL server run."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

READY = "AMQP_EVENTS_PROBE_READY"


@pytest.mark.skipif(READY not in os.environ, reason="run by test_the_test_command.py alone")
def test_a_node_a_worker_and_a_database_run_until_the_tests_are_stopped(worker, postgres):
    worker("orders")
    Path(os.environ[READY]).write_text("ready")
    threading.Event().wait(240)  # the interrupt comes first; bounded if it never does
