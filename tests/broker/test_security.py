"""The security guide's TLS example, as written, against a node of our own with a TLS listener (real broker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from docs_pages import code_blocks

from amqp_events.local.broker import LocalBroker
from amqp_events.local.processes import free_port
from amqp_events.testing import wait_for

pytestmark = pytest.mark.broker


def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA, and a certificate for localhost and 127.0.0.1 signed by it (openssl, as an operator would)."""
    directory.mkdir()

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=amqp-events test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj",
            "/CN=localhost")  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "san.cnf")  # fmt: skip
    for name in ("server.key", "server.pem", "ca.pem"):
        (directory / name).chmod(0o644)
    return {name: directory / f"{name}" for name in ("ca.pem", "server.pem", "server.key")}


@pytest.fixture
def tls_node(tmp_path):
    # Inside the node's directory: a node of the other RabbitMQ line runs in a root of its own, which sees only that.
    (tmp_path / "node").mkdir()
    certificates, port = make_certificates(tmp_path / "node" / "tls"), free_port()
    node = LocalBroker(
        tmp_path / "node",
        config={
            "listeners.ssl.default": f"127.0.0.1:{port}",
            "ssl_options.cacertfile": str(certificates["ca.pem"]),
            "ssl_options.certfile": str(certificates["server.pem"]),
            "ssl_options.keyfile": str(certificates["server.key"]),
            "ssl_options.verify": "verify_none",
            "ssl_options.fail_if_no_peer_cert": "false",
        },
    )
    node.start()
    try:
        yield port, certificates["ca.pem"]
    finally:
        node.stop()


def test_a_service_runs_over_tls_as_written(tls_node, tmp_path, start_worker):
    port, ca = tls_node
    (tmp_path / "billing_tls.py").write_text(
        code_blocks()["billing_tls.py"]
        .replace("amqps://guest:guest@localhost:5671/", f"amqps://guest:guest@localhost:{port}/")
        .replace("/etc/rabbitmq/tls/ca.pem", str(ca))
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    # BROKER_URL empty: the fixture points workers at the test vhost through it (Celery reads it as --broker).
    worker = start_worker("billing_tls", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "BROKER_URL": ""})

    def run(code: str) -> None:
        subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True, timeout=60)

    run("from billing_tls import invoice_paid; invoice_paid(42, '10.00')")
    run("from billing_tls import app; app.fire('billing.invoice.paid', [43, '1.00'], countdown=1)")  # the ladder
    run("from billing_tls import app; app.fire('billing.invoice.paid', ['not', 'enough', 'args'])")  # archived
    for line in ("invoice 42 paid over TLS: 10.00", "invoice 43 paid over TLS: 1.00", "reason=bad_arguments"):
        wait_for(lambda line=line: line in worker.log(), 30, what=line)
    amqp_events = str(Path(sys.executable).parent / "amqp-events")
    listed = subprocess.run([amqp_events, "-A", "billing_tls", "archive", "list"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert listed.returncode == 0 and "bad_arguments" in listed.stdout, listed.stderr
