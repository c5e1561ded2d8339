"""The examples of the README and the documentation site, run as written against a real broker."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from docs_pages import ALL_PAGES, EXAMPLE_BROKER, PAGES, ROOT, code_blocks, named_blocks, page, write_blocks

from amqp_events import events_app
from amqp_events.cli import main
from amqp_events.testing import json_lines, wait_for


def test_the_quick_start_works_as_written(tmp_path, start_worker, broker_url):
    files = code_blocks()
    assert {"orders/celery.py", "orders/handlers.py", "shipping/celery.py", "fire.py"} <= set(files)
    for name, body in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body.replace(EXAMPLE_BROKER, broker_url))
    workers = {}
    for service in ("orders", "shipping"):
        (tmp_path / service / "__init__.py").write_text("")
        command = f"celery -A {service}.celery worker --without-mingle --without-heartbeat --without-gossip"
        assert command in page("getting-started.md")
        workers[service] = start_worker(f"{service}.celery", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    fired = subprocess.run([sys.executable, "fire.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert fired.returncode == 0, fired.stderr
    wait_for(lambda: "invoice 42 paid: 10.00" in workers["orders"].log(), 20, what="orders' handler output")
    wait_for(lambda: "courier booked for invoice 42" in workers["shipping"].log(), 20, what="shipping's output")


def test_firing_again_under_the_id_in_doubt_works_as_written(tmp_path, rabbitmq, broker_url, start_worker):
    if rabbitmq.node is None:
        pytest.skip("needs the harness's own node (not $AMQP_URL) to stop it")
    write_blocks(tmp_path, broker_url, "orders/celery.py", "orders/handlers.py", "orders/refire.py")
    orders = start_worker("orders.celery", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    sys.path.insert(0, str(tmp_path))
    try:
        from orders.refire import fire_until_confirmed

        fire_until_confirmed("billing.invoice.paid", {"invoice_id": 6, "amount": "1"})
        wait_for(lambda: "invoice 6 paid: 1" in orders.log(), 30, what="the worker consuming")
        rabbitmq.node.stop()
        fired: list[str] = []
        firing = threading.Thread(
            target=lambda: fired.append(fire_until_confirmed("billing.invoice.paid", {"invoice_id": 7, "amount": "1"}))
        )
        firing.start()
        time.sleep(12)  # longer than the publish timeout (10 s): at least one attempt raised PublishError
        rabbitmq.node.start()
        firing.join(60)
        assert len(fired) == 1
    finally:
        sys.modules["orders.celery"].app.close()
        sys.path.remove(str(tmp_path))
        for module in [name for name in sys.modules if name == "orders" or name.startswith("orders.")]:
            del sys.modules[module]
    wait_for(lambda: "invoice 7 paid: 1" in orders.log(), 30, what="the event fired again, handled")


def test_the_event_key_example_works_as_written(tmp_path, broker_url, start_worker):
    write_blocks(tmp_path, broker_url, "store/celery.py")
    env = {"PYTHONPATH": str(tmp_path)}
    shop = start_worker("store.celery", cwd=tmp_path, env=env)  # as the page says: nothing to --include
    fire = "from store.celery import order_placed; order_placed(7, '12.50'); order_placed(order_id=8, total='1')"
    fired = subprocess.run([sys.executable, "-c", fire], cwd=tmp_path, env={**os.environ, **env}, timeout=60)
    assert fired.returncode == 0
    wait_for(lambda: "order 8 placed (key 8)" in shop.log(), 30, what="the handler reading the key")
    assert "order 7 placed (key 7)" in shop.log()


def test_the_ordered_handling_example_works_as_written(tmp_path, broker_url, start_worker, producer):
    write_blocks(tmp_path, broker_url, "accounts/celery.py", "accounts/handlers.py")
    accounts = start_worker(
        "accounts.celery", pool="threads", concurrency=4, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}
    )
    for move in range(6):
        for account_id in (1, 2, 3):
            producer.fire(
                "accounts.money.moved", kwargs={"account_id": account_id, "move": move, "amount": "1"}, key=account_id
            )
    for account_id in (1, 2, 3):
        producer.fire("accounts.account.closed", kwargs={"account_id": account_id}, key=account_id)
    wait_for(lambda: accounts.log().count(": closed") == 3, 30, what="every account closed")
    for account_id in (1, 2, 3):
        seen = re.findall(rf"account {account_id}: (move \d|closed)", accounts.log())
        assert seen == [*(f"move {move}" for move in range(6)), "closed"]


def test_the_tracing_example_works_as_written(tmp_path, broker_url, start_worker):
    write_blocks(tmp_path, broker_url, "telemetry.py", "orders/celery.py", "orders/handlers.py")
    module = tmp_path / "orders" / "celery.py"
    module.write_text("import telemetry  # noqa: F401\n" + module.read_text())  # as the section says
    env = {"PYTHONPATH": str(tmp_path)}
    orders = start_worker("orders.celery", cwd=tmp_path, env=env)
    fire = "from orders.celery import invoice_paid; invoice_paid(42, '10.00')"
    fired = subprocess.run(
        [sys.executable, "-c", fire],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert fired.returncode == 0, fired.stderr
    assert '"name": "publish billing.invoice.paid"' in fired.stdout  # exported when the process exits
    wait_for(lambda: '"name": "process billing.invoice.paid"' in orders.log(), 30, what="the worker's span")
    assert '"amqp_events.outcome": "success"' in orders.log()


def test_the_in_process_testing_examples_pass_as_written_without_a_broker(tmp_path):
    files = code_blocks()
    tests = {"tests/conftest.py", "tests/test_invoices.py", "tests/test_payments.py", "tests/test_capture.py"}
    assert tests <= set(files)
    for name in (*tests, "orders/celery.py", "orders/handlers.py", "shipping/celery.py", "payments/handlers.py"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[name])  # EXAMPLE_BROKER as written: nothing listens there, nothing may connect
    for package in ("orders", "shipping", "payments"):
        (tmp_path / package / "__init__.py").write_text("")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    ran = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "5 passed" in ran.stdout


def test_the_operating_example_works_as_written(tmp_path, start_worker, broker_url, monkeypatch):
    # The examples' services, and a copy of shipping with "the fix": an address for customer 'nobody'.
    fixed = tmp_path / "fixed"
    shutil.copytree(ROOT / "examples", fixed)
    source = (fixed / "shipping.py").read_text()
    (fixed / "shipping.py").write_text(source.replace("ADDRESSES = {", 'ADDRESSES = {"nobody": "7 New Street", '))
    journal = tmp_path / "journal.jsonl"
    env = {"DEMO_JOURNAL": str(journal), "PYTHONPATH": str(ROOT / "examples")}
    broken = start_worker("shipping", cwd=ROOT / "examples", env=env)

    monkeypatch.chdir(ROOT / "examples")
    monkeypatch.setenv("BROKER_URL", broker_url)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    for name in ("billing", "shipping", "journal"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import billing

    event_id = billing.invoice_paid(7, "25.00", "nobody")
    billing.app.close()
    runner = CliRunner()

    def run(line: str, **substitutions: str) -> str:
        for placeholder, value in substitutions.items():
            line = line.replace(placeholder, value)
        result = runner.invoke(main, shlex.split(line)[1:], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    commands = [line.strip()[2:] for line in page("guides/archive.md").splitlines() if line.strip().startswith("$ ")]
    listing, show, replay, final = commands
    wait_for(lambda: event_id in run(listing), 20, what="the message in the archive")
    assert "non_retryable" in run(listing) and "no shipping address for customer 'nobody'" in run(listing)
    shown_id = show.split()[-1]
    assert "PermanentFailure" in run(show, **{shown_id: event_id})

    broken.stop()
    start_worker("shipping", cwd=fixed, env={**env, "PYTHONPATH": str(fixed)})  # the fix is deployed
    assert "replayed 1 message(s)" in run(replay)
    assert "0 archived message(s)" in run(final)
    handled = wait_for(
        lambda: [line for line in json_lines(journal) if line["outcome"] == "handled"],
        20,
        what="the replayed message handled",
    )
    assert [line["id"] for line in handled] == [event_id]


README_DATABASE = "postgresql+psycopg://shop@localhost/shop"


def test_the_outbox_example_works_as_written(tmp_path, start_worker, broker_url, postgres_url):
    files = code_blocks()
    for name in ("orders/celery.py", "orders/handlers.py", "shop/celery.py", "shop/checkout.py"):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[name].replace(EXAMPLE_BROKER, broker_url).replace(README_DATABASE, postgres_url))
        (path.parent / "__init__.py").touch()
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    orders = start_worker("orders.celery", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    init, relay = [
        shlex.split(line.strip())
        for line in page("guides/outbox.md").splitlines()
        if line.strip().startswith("amqp-events -A shop.celery outbox")
    ]
    amqp_events = str(Path(sys.executable).parent / "amqp-events")
    done = subprocess.run([amqp_events, *init[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    relaying = subprocess.Popen([amqp_events, *relay[1:]], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        pay = "from shop.checkout import pay; pay(42, '10.00')"  # as written: the page creates its table
        paid = subprocess.run(
            [sys.executable, "-c", pay], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert paid.returncode == 0, paid.stderr
        wait_for(lambda: "invoice 42 paid: 10.00" in orders.log(), 30, what="orders' handler of the paid invoice")
    finally:
        relaying.terminate()
        _, said = relaying.communicate(timeout=30)
    assert relaying.returncode == 0, said


def test_the_exactly_once_examples_work_as_written(
    tmp_path, start_worker, broker_url, postgres_url, redis_url, producer
):
    files = code_blocks()
    replacements = {
        EXAMPLE_BROKER: broker_url,
        "postgresql+psycopg://payments@localhost/payments": postgres_url,
        "redis://localhost:6379/0": redis_url,
    }
    for name in ("payments/celery.py", "mailer/celery.py"):
        text = files[name]
        for written, real in replacements.items():
            text = text.replace(written, real)
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        (path.parent / "__init__.py").touch()
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    [init] = [
        shlex.split(line.strip())
        for line in page("guides/exactly-once.md").splitlines()
        if line.strip().startswith("amqp-events -A payments.celery inbox init")
    ]
    amqp_events = str(Path(sys.executable).parent / "amqp-events")
    made = "from payments.celery import Base, sessions; Base.metadata.create_all(sessions.kw['bind'])"
    for command in ([amqp_events, *init[1:]], [sys.executable, "-c", made]):
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    payments = start_worker("payments.celery", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    mailer = start_worker("mailer.celery", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    message = producer.event_message("billing.invoice.paid", [42, "10.00"], {})
    for _ in range(2):  # delivered twice, as after a lost ack
        producer.transport.publish(message)
    for worker in (payments, mailer):
        wait_for(lambda worker=worker: "duplicate skipped" in worker.log(), 30, what="the second copy skipped")
    assert mailer.log().count("receipt for invoice 42 sent") == 1
    from sqlalchemy import create_engine, text

    engine = create_engine(postgres_url)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM payments")).scalar_one() == 1
    engine.dispose()


def test_the_circuit_breaker_example_works_as_written(tmp_path, start_worker, broker_url, monkeypatch):
    import http.server
    import threading

    from amqp_events import events_app

    class Bank(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    def bank_up(port: int = 0) -> http.server.HTTPServer:
        server = http.server.HTTPServer(("127.0.0.1", port), Bank)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    source = code_blocks()["ledger/celery.py"]
    assert "interval=10" in source
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "__init__.py").write_text("")
    (tmp_path / "ledger" / "celery.py").write_text(
        source.replace(EXAMPLE_BROKER, broker_url).replace("interval=10", "interval=1")  # a quicker test
    )
    bank = bank_up()
    port = bank.server_address[1]
    env = {"PYTHONPATH": str(tmp_path), "BANK_URL": f"http://127.0.0.1:{port}"}
    start_worker("ledger.celery", cwd=tmp_path, env=env)
    producer = events_app("tests", broker_url=broker_url)

    def consumers(queue: str) -> tuple[int, int]:
        with producer.connection_for_read() as connection:
            declared = connection.default_channel.queue_declare(queue, passive=True)
            return declared.message_count, declared.consumer_count

    paid, voided = "ledger:billing.invoice.paid", "ledger:billing.invoice.voided"
    wait_for(lambda: consumers(paid) == (0, 1), 30, what="the worker consuming")
    bank.shutdown()
    bank.server_close()
    wait_for(lambda: consumers(paid)[1] == 0, 10, what="post_to_bank paused: the bank's API is unhealthy")
    producer.fire("billing.invoice.paid", [42, "10.00"], {})
    time.sleep(1)
    assert consumers(paid) == (1, 0)  # waiting on the broker
    bank = bank_up(port)
    wait_for(lambda: consumers(paid) == (0, 1), 10, what="post_to_bank resumed and the event handled")
    bank.shutdown()

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BANK_URL", env["BANK_URL"])
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = CliRunner()
    lines = [line.strip() for line in page("guides/sections-and-breakers.md").splitlines()]
    assert any("`amqp-events -A APP breakers open post_to_bank`" in line for line in lines)
    for action, count in (("open", 0), ("close", 1)):
        # Replies wait the whole --wait; a loaded machine (a cluster test beside this one) can take over 3 s.
        result = runner.invoke(main, ["-A", "ledger.celery", "breakers", action, "void_posting", "--wait", "10"])
        assert result.exit_code == 0 and f"{action}: 1 worker(s)" in result.output, result.output
        assert consumers(voided)[1] == count
    listed = runner.invoke(main, ["-A", "ledger.celery", "breakers", "--wait", "3"])
    assert "breaker  half-open  ledger.celery.void_posting" in listed.output, (
        listed.output
    )  # its probe awaits a message
    assert "health   unhealthy  bank-api" in listed.output, listed.output
    producer.close()


def test_the_middleware_example_works_as_written(tmp_path, start_worker, broker_url, producer, monkeypatch):
    write_blocks(tmp_path, broker_url, "audit/celery.py")
    audit = tmp_path / "archived.jsonl"
    start_worker("audit.celery", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    event_id = producer.fire("billing.invoice.paid", [42, "10.00"], {})
    [line] = wait_for(lambda: json_lines(audit), 30, what="the audit line")
    assert (line["service"], line["event"], line["id"], line["reason"]) == (
        "audit",
        "billing.invoice.paid",
        event_id,
        "max_retries",
    )
    # The same middleware in the in-process mode: it is the app's, wherever the app's handlers run.
    from amqp_events.testing import in_process

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    audit.unlink()
    from audit.celery import app

    with in_process(app):
        app.fire("billing.invoice.paid", [7, "1.00"], {})
    assert json_lines(audit)[0]["reason"] == "max_retries"


def test_every_python_block_runs_in_the_suite_or_is_a_fragment_on_purpose():
    tests = "".join(path.read_text() for path in (ROOT / "tests").glob("test_*.py"))
    named, fragments, neither = set(), [], []
    for path, text in PAGES.items():
        for mark, body in re.findall(r"(<!-- fragment: [^>]+ -->\n)?```python\n(.*?)```", text, flags=re.S):
            compile(body, path, "exec")  # fragments too: at least they parse
            first = body.split("\n", 1)[0]
            if mark:
                fragments.append(first)
            elif re.fullmatch(r"# \S+\.py", first):
                named.add(first[2:])
            else:
                neither.append(f"{path}: {first}")
    assert neither == []
    assert [name for name in named if f'"{name}"' not in tests] == []  # each named block is written by a test
    assert (len(named), len(fragments)) == (27, 6)


def test_a_file_named_on_two_pages_is_the_same_file():
    bodies: dict[str, set[str]] = {}
    for _, name, body in named_blocks():
        bodies.setdefault(name, set()).add(body)
    assert {name for name, found in bodies.items() if len(found) > 1} == set()


def test_the_readme_is_a_landing_page_whose_set_up_commands_come_first():
    readme = page("README.md")
    assert len(readme.splitlines()) < 200
    first_commands = [line.strip() for line in readme.splitlines()[2:4]]
    assert [command.split("#")[0].strip() for command in first_commands] == ["bash scripts/demo", "bash scripts/test"]
    for script in ("demo", "test"):
        assert (ROOT / "scripts" / script).exists()
    linked = re.findall(r"\]\(((?:docs/)?[\w/.-]+\.md)\)", readme)
    assert linked and [path for path in linked if not (ROOT / path).is_file()] == []


def test_the_twenty_line_example_works_as_written(tmp_path, start_worker, broker_url):
    write_blocks(tmp_path, broker_url, "shop.py")
    assert len(code_blocks()["shop.py"].splitlines()) <= 20
    commands = [line.strip() for line in page("README.md").split("## In 20 lines", 1)[1].splitlines()]
    worker = "celery -A shop worker --without-mingle --without-heartbeat --without-gossip"
    assert worker in commands
    [fire] = [line.split("   #")[0] for line in commands if line.startswith("python -c ")]
    env = {"PYTHONPATH": str(tmp_path)}
    shop = start_worker("shop", cwd=tmp_path, env=env)
    fired = subprocess.run(
        [sys.executable, *shlex.split(fire)[1:]], cwd=tmp_path, env={**os.environ, **env}, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert fired.returncode == 0, fired.stderr
    wait_for(lambda: "invoice 42 paid: 10.00" in shop.log(), 30, what="the handler's output")


def write_testing_guide(directory: Path, *tests: str) -> None:
    """The testing guide's configuration and ``tests``, with the quick start's services, into ``directory``."""
    files = code_blocks()
    [pyproject] = re.findall(r"```toml\n# pyproject.toml\n(.*?)```", page("guides/testing.md"), flags=re.S)
    (directory / "pyproject.toml").write_text(pyproject)
    for name in ("tests/conftest.py", *tests, "orders/celery.py", "orders/handlers.py", "shipping/celery.py"):
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[name])
    for package in ("orders", "shipping"):
        (directory / package / "__init__.py").write_text("")


def test_plain_pytest_runs_the_testing_section_s_tests_with_its_configuration(tmp_path):
    write_testing_guide(tmp_path, "tests/test_invoices.py")
    pytest = str(Path(sys.executable).parent / "pytest")  # the plain command, not python -m pytest
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    ran = subprocess.run([pytest, "-q", "-p", "no:cacheprovider"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "2 passed" in ran.stdout


@pytest.mark.broker
def test_the_testing_guide_s_test_with_real_workers_fires_into_the_test_s_own_broker(tmp_path, rabbitmq):
    """The app of ``orders.celery`` says localhost:5672; the test's fire reaches the worker on the test's vhost."""
    write_testing_guide(tmp_path, "tests/test_with_workers.py")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(AMQP_URL=rabbitmq.amqp_url, AMQP_MANAGEMENT_URL=rabbitmq.management.base_url)
    pytest = str(Path(sys.executable).parent / "pytest")
    ran = subprocess.run([pytest, "-q", "-p", "no:cacheprovider", "tests/test_with_workers.py"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 passed" in ran.stdout


def test_the_extras_bring_what_their_names_say():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any("psycopg" in requirement for requirement in extras["sqlalchemy"] + extras["django"])
    assert any("psycopg" in requirement for requirement in extras["postgres"])
    assert [requirement.split(">")[0] for requirement in extras["testing"]] == ["pytest"]


def test_every_test_the_pages_name_exists():
    """The "shown by" columns and paragraphs name tests (``test_archive.py::test_...``): renaming one must not leave a
    dangling reference."""
    named = set(re.findall(r"(test_\w+\.py)::(test_\w+)", ALL_PAGES))
    assert named
    missing = [
        f"{module}::{test}"
        for module, test in sorted(named)
        if not re.search(rf"^def {test}\(", (ROOT / "tests" / module).read_text(), flags=re.M)
    ]
    assert missing == []


def test_a_read_model_catches_up_from_the_history_as_written(tmp_path, start_worker, broker_url):
    write_blocks(tmp_path, broker_url, "reports/celery.py", "reports/handlers.py")
    billing = events_app("billing", broker_url=broker_url, amqp_events_history=True)
    billing.declare_topology()
    for invoice in (1, 2, 3):  # before the reports service exists
        billing.fire("billing.invoice.paid", [invoice, f"{invoice}.00"])
    commands = [line.strip() for line in page("guides/history.md").splitlines() if line.startswith("    amqp-events")]
    assert len(commands) == 2
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    amqp_events = str(Path(sys.executable).parent / "amqp-events")
    for command in commands:
        done = subprocess.run(
            [amqp_events, *shlex.split(command)[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
    assert "replayed 3 event(s) to reports" in done.stdout
    worker = "celery -A reports.celery worker --without-mingle --without-heartbeat --without-gossip"
    assert worker in page("guides/history.md")
    start_worker("reports.celery", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    billing.fire("billing.invoice.paid", [4, "4.00"])  # live
    billing.close()
    database = sqlite3.connect(tmp_path / "reports.sqlite3")

    def paid() -> list:
        return database.execute("select invoice_id, amount from paid_invoices order by invoice_id").fetchall()

    wait_for(lambda: len(paid()) >= 4, 60, what="the read model caught up and live")
    assert paid() == [(1, "1.00"), (2, "2.00"), (3, "3.00"), (4, "4.00")]
