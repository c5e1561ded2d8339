"""Interoperability with clients not written in Python, nor by us: Node.js with the npm packages ``amqplib``,
``cloudevents`` and ``@asyncapi/parser``, installed from the registry into a directory of the test session.

* a Node producer fires CloudEvents (binary and structured) that a Python handler receives, and keyed ones
  that an ordered handler receives in order, with the slot computed in JavaScript or without it;
* a Python service fires CloudEvents that a Node consumer reads with the CloudEvents SDK;
* the AsyncAPI documents of the demo's services pass the AsyncAPI parser.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
from click.testing import CliRunner
from helpers import ROOT, TESTS
from process_helpers import printed

from amqp_events import events_app
from amqp_events.cli import main
from amqp_events.testing import wait_for
from amqp_events.topology.names import slot_of

NODE_SCRIPTS = TESTS / "node"
EXAMPLES = ROOT / "examples"
NPM_PACKAGES = ("amqplib@^2.3", "cloudevents@^10", "@asyncapi/parser@^3.6")

pytestmark = pytest.mark.xdist_group("node")  # one npm install, in whichever test process runs them


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment to run ``node`` with the npm packages installed (skips only where Node is missing)."""
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("Node.js and npm are not installed on this machine: the interop tests need them")
    prefix = tmp_path_factory.mktemp("npm")
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix), *NPM_PACKAGES],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return {**os.environ, "NODE_PATH": str(prefix / "node_modules")}


def run_node(node: dict[str, str], script: str, *args: str, timeout: float = 60) -> str:
    done = subprocess.run(
        ["node", str(NODE_SCRIPTS / script), *args], env=node, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"node {script} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_a_node_producer_fires_a_cloud_event_that_a_python_handler_receives(
    mode, node, worker, producer, broker_url, records
):
    worker("orders")
    producer.declare_topology()  # the events exchange, before a foreign producer publishes to it
    event_id = f"node-{mode}-{uuid.uuid4().hex[:8]}"
    data = json.dumps({"invoice_id": 42, "amount": "10.00"})
    run_node(node, "fire.js", broker_url, mode, "billing.invoice.paid", event_id, data)
    [run] = records.wait(1, tag="invoice-42")
    assert (run["event"], run["id"], run["fired_by"], run["amount"]) == (
        "billing.invoice.paid",
        event_id,
        None,  # its source is its sender's say: no user_id, no verified author
        "10.00",
    )


def test_a_node_producer_s_keyed_events_reach_an_ordered_handler_in_order_with_or_without_the_slot(
    node, worker, producer, broker_url, records
):
    worker("ledger")
    producer.declare_topology()
    for account, slot in (("nöde-slot", "with-slot"), ("node-key", "")):
        for seq in range(6):
            data = json.dumps({"account": account, "seq": seq})
            run_node(
                node, "fire.js", broker_url, "binary", "accounts.money.moved", f"{account}-{seq}", data, account, slot
            )
    wait_for(lambda: len(records.all(service="ledger")) == 12, 60, what="12 events handled")
    for account in ("nöde-slot", "node-key"):
        assert [run["seq"] for run in records.all(account=account)] == list(range(6))
    script = (
        "const z = require('zlib'); for (const k of process.argv.slice(1)) console.log(z.crc32(Buffer.from(k)) % 64)"
    )
    keys = [f"acct-{n}" for n in range(100)] + ["é", "注文-42", "123456789"]
    slots = subprocess.run(["node", "-e", script, *keys], capture_output=True, text=True, check=True, timeout=30)
    assert slots.stdout.split() == [slot_of(key) for key in keys]  # the same slot in either language


def test_a_node_consumer_reads_what_a_python_service_fires_as_cloud_events(node, broker_url):
    app = events_app("billing", broker_url=broker_url, amqp_events_wire_format="cloudevents")
    app.declare_topology()
    consumer = subprocess.Popen(
        ["node", str(NODE_SCRIPTS / "consume.js"), broker_url, "billing.invoice.paid", "2"],
        env=node,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert printed(consumer, 1, timeout=30) == ["ready"]
        ids = [
            app.fire("billing.invoice.paid", kwargs={"invoice_id": n, "amount": f"{n}.00"}, countdown=n - 1)
            for n in (1, 2)  # the second waits a second on the delay ladder first
        ]
        out, err = consumer.communicate(timeout=30)
    finally:
        consumer.kill()
        consumer.wait(timeout=10)
        app.close()
    assert consumer.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    for event, event_id, n in zip(events, ids, (1, 2), strict=True):
        assert (event["type"], event["id"], event["source"], event["specversion"]) == (
            "billing.invoice.paid",
            event_id,
            "billing",
            "1.0",
        )
        assert event["data"] == {"invoice_id": n, "amount": f"{n}.00"} and event["time"].endswith("Z")


def test_the_asyncapi_documents_of_the_demo_services_pass_the_asyncapi_parser(node, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    runner = CliRunner()
    for service in ("billing", "orders", "shipping", "notifications"):
        for output_format in ("yaml", "json"):
            document = tmp_path / f"{service}.{output_format}"
            result = runner.invoke(
                main,
                ["-A", service, "asyncapi", "--format", output_format, "-o", str(document)],
                catch_exceptions=False,
            )
            assert result.exit_code == 0, result.output
            report = run_node(node, "asyncapi.js", str(document)).splitlines()
            counts = json.loads(report[-1])
            assert counts["channels"] > 0 and counts["operations"] > 0, report
            assert not [line for line in report[:-1] if json.loads(line)["severity"] <= 1], report  # nor warnings
        sys.modules.pop(service, None)
