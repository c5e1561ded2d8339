"""The dashboard and alert rules: valid, unit-tested with promtool, about metrics the code exports, and live."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request

import pytest
import yaml
from helpers import ROOT, wait_archived

from amqp_events import events_app
from amqp_events.exporter import Exporter
from amqp_events.local.processes import free_port
from amqp_events.metrics import instruments
from amqp_events.testing import wait_for

MONITORING = ROOT / "monitoring"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMTOOL is None or PROMETHEUS is None, reason="Debian's prometheus package is not installed (scripts/setup does)"
)


@needs_prometheus
def test_the_alert_rules_are_valid_and_pass_their_unit_tests():
    for command in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        done = subprocess.run([PROMTOOL, *command], cwd=MONITORING, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def exported_names() -> set[str]:
    """Every metric family name the library exports: worker and producer instruments, and the exporter's."""
    names = {family.name for metric in instruments().values() for family in metric.describe()}
    exporter = Exporter(events_app("orders"), None)
    names |= {family.name for family in exporter.collect()}
    return names


def referenced_names() -> set[str]:
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    expressions = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    expressions += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    expressions += [variable["definition"] for variable in dashboard["templating"]["list"] if "definition" in variable]
    found = set()
    for expression in expressions:
        for name in re.findall(r"\bamqp_events_[a-z_]+", expression):
            found.add(re.sub(r"_(bucket|sum|count|total|created)$", "", name))
    return found


def test_every_metric_the_dashboard_and_rules_use_is_exported():
    referenced = referenced_names()
    assert len(referenced) >= 12
    assert referenced <= exported_names(), referenced - exported_names()


def test_the_dashboard_has_service_and_handler_variables_and_the_promised_panels():
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    assert {"service", "handler"} <= {variable["name"] for variable in dashboard["templating"]["list"]}
    titles = " | ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for topic in ("outcome", "exception", "duration", "queue depth", "archive", "workers online", "circuit breakers"):
        assert topic in titles


@needs_prometheus
@pytest.mark.broker
def test_prometheus_sees_the_archive_alert_fire(tmp_path, worker, producer, archive_of, rabbitmq, service_app):
    worker("orders", env={"HEARTBEAT_INTERVAL": "1"})
    exporter_port, prometheus_port = free_port(), free_port()
    exporter = Exporter(service_app("orders"), rabbitmq.management, interval=1, worker_timeout=5)
    server = exporter.serve("127.0.0.1", exporter_port)
    rules = (MONITORING / "alerts.yml").read_text().replace("[10m]", "[1m]")  # same rule, a test-sized window
    (tmp_path / "alerts.yml").write_text(rules)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "rule_files: [alerts.yml]\n"
        "scrape_configs:\n"
        "  - job_name: amqp-events-exporter\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
    )
    prometheus = subprocess.Popen(
        [
            PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def api(path: str) -> dict:
            with urllib.request.urlopen(f"http://127.0.0.1:{prometheus_port}{path}", timeout=5) as response:
                return json.loads(response.read())

        def scraped_archive_depth() -> bool:
            try:
                query = api("/api/v1/query?query=amqp_events_queue_messages_ready%7Bkind%3D%22archive%22%7D")
            except OSError:
                return False
            return bool(query["data"]["result"])

        wait_for(scraped_archive_depth, 60, what="Prometheus scraping the exporter")
        time.sleep(3)  # a few samples of an empty archive first
        assert not [a for a in api("/api/v1/alerts")["data"]["alerts"] if "Archive" in a["labels"]["alertname"]]
        producer.fire("test.ping", ["doomed"], {"how": {"permanent": True}})
        wait_archived(archive_of("orders"), 1)

        def archive_alert_firing() -> list:
            alerts = api("/api/v1/alerts")["data"]["alerts"]
            return [
                alert
                for alert in alerts
                if alert["labels"]["alertname"] == "AmqpEventsArchiveReceivedMessages" and alert["state"] == "firing"
            ]

        [alert] = wait_for(archive_alert_firing, 60, what="the archive alert to fire")
        assert alert["labels"]["queue"] == "orders.archive" and alert["labels"]["service"] == "orders"
    finally:
        prometheus.terminate()
        prometheus.wait(30)
        exporter.stop()
        server.shutdown()
