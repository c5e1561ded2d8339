"""A worker's health probes (``/livez``, ``/readyz``) follow the broker and its own event loop (real broker,
stopped and started by the test; a handler that holds a solo worker's loop)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from amqp_events.local.processes import free_port
from amqp_events.testing import wait_for


@pytest.fixture
def node(rabbitmq):
    if rabbitmq.node is None:
        pytest.skip("needs the harness's own node (not $AMQP_URL) to stop it")
    return rabbitmq.node


def probe(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_readiness_follows_the_broker_and_liveness_the_worker_s_loop(node, worker, producer, records):
    port = free_port()
    worker("orders", env={"AMQP_EVENTS_HEALTH_PORT": str(port), "HEALTH_STALL": "2"})
    wait_for(lambda: probe(port, "/readyz")[0] == 200, 30, what="the worker ready")
    assert probe(port, "/livez")[0] == 200 and probe(port, "/nothing")[0] == 404

    node.stop()
    _, said = wait_for(lambda: (found := probe(port, "/readyz"))[0] == 503 and found, 30, what="not ready")
    assert not said["ready"] and said["why"]
    assert probe(port, "/livez")[0] == 200  # reconnecting is not being stuck: a restart would not help
    node.start()
    wait_for(lambda: probe(port, "/readyz")[0] == 200, 60, what="ready again once the broker is back")

    # A handler that holds the solo worker's loop longer than the stall: not live meanwhile, live again after.
    # 12 s against the stall of 2 s: the probes have some 10 s to see it, however loaded the machine.
    producer.fire("test.ping", ["holds the loop"], {"how": {"sleep": 12}})
    _, said = wait_for(lambda: (found := probe(port, "/livez"))[0] == 503 and found, 30, what="not live")
    assert said["loop_turned_seconds_ago"] > 2
    records.wait(1, tag="holds the loop")
    wait_for(lambda: probe(port, "/livez")[0] == 200, 30, what="live again")


def test_the_command_as_typed_is_ready_while_its_processes_consume(node, worker, producer, records):
    """The consuming pool's main process consumes nothing: it is ready while each of its processes consumes."""
    port = free_port()
    worker("orders", "-c", "2", "--loglevel=INFO", as_written=True, env={"AMQP_EVENTS_HEALTH_PORT": str(port)})
    ready = lambda: (found := probe(port, "/readyz"))[0] == 200 and found  # noqa: E731
    assert wait_for(ready, 30, what="the worker ready")[1]["why"] == "connected; its 2 processes consuming"
    node.stop()
    _, said = wait_for(lambda: (found := probe(port, "/readyz"))[0] == 503 and found, 30, what="not ready")
    assert not said["ready"] and said["why"]
    node.start()
    wait_for(ready, 60, what="ready again once every process consumes again")
    producer.fire("test.ping", ["after"], {})
    records.wait(1, tag="after")
