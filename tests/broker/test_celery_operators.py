"""Celery's operator tools against an events app's worker: each `celery inspect` and `celery control` command, task
events, log options and Flower tell the same truth on the default pool (`celery worker -c 2`, no `-P`) as on
`-P prefork` (real broker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, TESTS, Records, skip_outside_ci, wait_archived

from amqp_events import Reason, events_app
from amqp_events.local.processes import free_port, terminate
from amqp_events.testing import wait_for
from amqp_events.testing.workers import WorkerProcess

POOLS = [pytest.param(None, id="default"), pytest.param("prefork", id="prefork")]
#: What an operator's worker runs with: task events (-E) and heartbeats, as Flower wants them.
OPERATED = ("--without-mingle", "--without-gossip", "-E", "--loglevel=INFO")
#: Flower's ``celery`` command, in the virtualenv `scripts/setup dev` makes for it.
FLOWER = ROOT / ".venv-flower" / "bin" / "celery"


@pytest.fixture
def operated(broker_url: str, records: Records, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """``operated(pool, "-c", "2")``: ``celery -A services.orders worker`` with events and heartbeats on, stopped
    by its PID at the end."""
    started: list[WorkerProcess] = []

    def start(pool: str | None, *extra: str, env: dict[str, str] | None = None) -> WorkerProcess:
        name = f"op{len(started) + 1}-{os.getpid()}"
        argv = [sys.executable, "-m", "celery", "-A", "services.orders", "worker", *OPERATED,
                *(["-P", pool] if pool else []), "-n", f"{name}@%h", *extra]  # fmt: skip
        environment = {**os.environ, "BROKER_URL": broker_url, "RECORD_FILE": str(records.path),
                       "PYTHONPATH": str(TESTS), "PYTHONUNBUFFERED": "1", **(env or {})}  # fmt: skip
        worker = WorkerProcess(argv, environment, TESTS, tmp_path / f"{name}.log").start()
        started.append(worker)
        if not any(option.startswith("-f") for option in extra):
            worker.wait_ready(60)
        return worker

    yield start
    for worker in started:
        worker.stop()


def celery(broker_url: str, *args: str) -> Any:
    """``celery -A services.orders ARGS --json`` as an operator types it; its answer by worker."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "services.orders", *args, "--json", "--timeout", "5"],
        env={**os.environ, "BROKER_URL": broker_url, "PYTHONPATH": str(TESTS)},
        cwd=TESTS, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    replies = json.loads(done.stdout)  # `inspect`: {worker: answer}; `control`: [{worker: answer}, ...]
    answers = (
        {worker: answer for reply in replies for worker, answer in reply.items()}
        if isinstance(replies, list)
        else replies
    )
    [answer] = answers.values()  # one worker
    return answer


def fire(broker_url: str, tag: str, how: dict[str, Any] | None = None, event_id: str | None = None) -> str:
    app = events_app("tests", broker_url=broker_url)
    try:
        return app.fire("test.ping", [tag], {"how": how} if how else {}, event_id=event_id)
    finally:
        app.close()


@pytest.mark.parametrize("pool", POOLS)
def test_inspect_shows_the_runs_the_totals_the_processes_and_the_queues(pool, operated, broker_url, records, tmp_path):
    operated(pool, "-c", "2")
    released = tmp_path / "released"
    for n in range(4):  # each run lasts until the test has seen two of them
        fire(broker_url, f"slow-{n}", {"until": str(released)})
    records.wait(2, timeout=30)
    active = wait_for(lambda: len(found := celery(broker_url, "inspect", "active")) == 2 and found, 30,
                      what="two runs active")  # fmt: skip
    released.touch()
    shown = [run["args"][0] for run in active]
    assert len(set(shown)) == 2 and set(shown) <= {f"slow-{n}" for n in range(4)}, shown
    assert {run["name"] for run in active} == {"test.ping"} and len({run["worker_pid"] for run in active}) == 2
    records.wait(4, timeout=30)
    stats = wait_for(
        lambda: (found := celery(broker_url, "inspect", "stats"))["total"].get("test.ping") == 4 and found,
        30,
        what="the four runs counted",
    )
    assert len(stats["pool"]["processes"]) == 2 and stats["prefetch_count"] >= 2
    queues = {queue["name"] for queue in celery(broker_url, "inspect", "active_queues")}
    assert "orders:test.ping" in queues and "orders:test.orders_only" in queues
    assert celery(broker_url, "inspect", "query_task", "nothing-such") == {}


@pytest.mark.parametrize("pool", POOLS)
def test_revoke_archives_a_waiting_event_and_terminate_ends_the_run_it_names(
    pool, operated, broker_url, records, archive_of
):
    operated(pool, "-c", "1")
    fire(broker_url, "running", {"sleep": 60}, event_id="running-1")
    fire(broker_url, "waiting", event_id="waiting-1")
    records.wait(1, tag="running")
    assert "flagged as revoked" in celery(broker_url, "control", "revoke", "waiting-1")["ok"]
    assert celery(broker_url, "control", "terminate", "KILL", "running-1")["ok"] == "terminate: running-1"
    archived = {entry.id: entry for entry in wait_archived(archive_of("orders"), 2)}
    assert {entry.reason for entry in archived.values()} == {Reason.REVOKED}
    fire(broker_url, "after")  # runs once the worker took both back: neither ran again
    records.wait(1, tag="after")
    assert [r["tag"] for r in records.all()] == ["running", "after"]
    assert "waiting-1" in celery(broker_url, "inspect", "revoked")


@pytest.mark.parametrize("pool", POOLS)
def test_time_limit_applies_to_the_next_runs_and_rate_limit_is_held_or_refused_saying_why(
    pool, operated, broker_url, records, archive_of
):
    operated(pool, "-c", "1", env={"MAX_RETRIES": "0"})
    assert celery(broker_url, "control", "time_limit", "test.ping", "1", "30")["ok"] == "time limits set successfully"
    fire(broker_url, "limited", {"sleep": 3})
    [entry] = wait_archived(archive_of("orders"), 1)
    assert entry.exception_type.endswith("SoftTimeLimitExceeded")
    answer = celery(broker_url, "control", "rate_limit", "test.ping", "1/m")
    if pool is None:  # Celery's limit would count per process and hold what waits in memory
        assert "limits set test.ping --rate-limit 1/m" in answer["error"]
    else:
        assert answer["ok"] == "new rate limit set successfully"


@pytest.mark.parametrize("pool", POOLS)
def test_pool_grow_and_shrink_change_the_processes(pool, operated, broker_url):
    operated(pool, "-c", "2")
    assert celery(broker_url, "control", "pool_grow", "1")["ok"] == "pool will grow"
    wait_for(lambda: len(celery(broker_url, "inspect", "stats")["pool"]["processes"]) == 3 or None, 30)
    assert celery(broker_url, "control", "pool_shrink", "2")["ok"] == "pool will shrink"
    wait_for(lambda: len(celery(broker_url, "inspect", "stats")["pool"]["processes"]) == 1 or None, 30)


@pytest.mark.parametrize("pool", POOLS)
def test_a_hard_time_limit_counts_as_a_lost_run_on_both_pools(pool, operated, broker_url, records, archive_of):
    operated(pool, "-c", "1", "--time-limit", "1")
    fire(broker_url, "stuck", {"sleep": 30}, event_id="stuck-1")
    [entry] = wait_archived(archive_of("orders"), 1, timeout=60)
    assert (entry.id, entry.reason) == ("stuck-1", Reason.WORKER_LOST)
    assert len(records.all(tag="stuck")) == 3  # amqp_events_max_deliveries, as the consuming pool counts it


def test_each_process_logs_to_its_own_file_and_a_run_is_logged_as_celery_logs_it(operated, broker_url, tmp_path):
    log = tmp_path / "worker-%i.log"
    operated(None, "-c", "2", "-f", str(log))
    files = [tmp_path / f"worker-{index}.log" for index in range(3)]  # the main process's, then each process's
    wait_for(lambda: " ready." in files[0].read_text() if files[0].exists() else None, 60, what="the worker ready")
    wait_for(lambda: all(path.exists() for path in files) or None, 30, what="a log file per process")
    event_id = fire(broker_url, "logged")
    lines = wait_for(
        lambda: len(found := [line for path in files[1:] for line in path.read_text().splitlines() if event_id in line])
        >= 2
        and found,
        30, what="the run's lines",
    )  # fmt: skip
    assert any(f"Task test.ping[{event_id}] received" in line for line in lines), lines
    assert any(f"Task test.ping[{event_id}] succeeded in" in line for line in lines)


# -- Flower ----------------------------------------------------------------------------------------------------


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = answer.read().decode()
    return json.loads(body) if answer.headers.get_content_type() == "application/json" else body


def serving(url: str) -> Any:
    """What ``url`` answers, ``None`` until something listens there."""
    try:
        return get(url) or None
    except OSError:
        return None


def test_flower_shows_the_processes_each_task_s_state_and_the_queues(operated, broker_url, rabbitmq, records, tmp_path):
    if not FLOWER.exists():
        skip_outside_ci(f"Flower's virtualenv is not there ({FLOWER}): `bash scripts/setup dev` makes it")
    operated(None, "-c", "2")
    port = free_port()
    management = rabbitmq.management.base_url.replace("://", "://guest:guest@") + "/api/"
    # With the app (the service's own remote-control exchange), from a virtualenv of its own beside the worker's.
    flower = subprocess.Popen(
        [str(FLOWER), "-A", "services.orders", "flower", f"--port={port}", "--address=127.0.0.1",
         f"--broker_api={management}"],
        # Its HTTP API answers without a login only so told (an operator's Flower has --basic-auth or OAuth).
        env={**os.environ, "BROKER_URL": broker_url, "PYTHONPATH": str(TESTS), "FLOWER_UNAUTHENTICATED_API": "1"},
        cwd=TESTS, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        workers = wait_for(lambda: serving(f"{base}/api/workers?refresh=1"), 60, what="Flower's workers")
        [(name, worker)] = workers.items()
        assert len(worker["stats"]["pool"]["processes"]) == 2
        ids = {
            "archived": fire(broker_url, "doomed", {"permanent": True}),
            "retried": fire(broker_url, "later", {"countdown": 600}),
            "handled": fire(broker_url, "fine"),
        }
        wanted = {"archived": "FAILURE", "retried": "RETRY", "handled": "SUCCESS"}

        def states() -> dict[str, str] | None:
            tasks = get(f"{base}/api/tasks")
            found = {what: tasks.get(task_id, {}).get("state") for what, task_id in ids.items()}
            return found if found == wanted else None

        wait_for(states, 30, what=f"Flower's task states to be {wanted}")
        failed = get(f"{base}/api/task/info/{ids['archived']}")
        assert "non_retryable" in failed["exception"] and failed["args"] == "['doomed']"
        retried = get(f"{base}/api/task/info/{ids['retried']}")
        assert "Retry(" not in retried["exception"], retried["exception"]  # the handler's own, not a wrapped Retry
        broker_page = get(f"{base}/broker")
        assert "orders:test.ping" in broker_page and "No queue data" not in broker_page
        # The worker's heartbeats count the processes' runs (Flower's Active column, its gauge here).
        released = tmp_path / "released"
        fire(broker_url, "slow", {"until": str(released)})  # runs until a heartbeat has counted it
        gauge = f'flower_worker_number_of_currently_executing_tasks{{worker="{name}"}} 1.0'
        wait_for(lambda: gauge in get(f"{base}/metrics") or None, 30, what="a heartbeat counting the run")
        released.touch()
        # Flower's Grow button.
        grown = urllib.request.Request(f"{base}/api/worker/pool/grow/{name}?n=1", method="POST", data=b"")
        urllib.request.urlopen(grown, timeout=10).close()
        wait_for(lambda: len(get(f"{base}/api/workers?refresh=1")[name]["stats"]["pool"]["processes"]) == 3 or None, 30)
    finally:
        terminate(flower.pid, 10)
        flower.wait(10)
