"""The pages that need nothing but the library: the README, getting started, firing, ordering, history,
middleware, the archive, sections and breakers, flow control. Each runs as its reader runs it (see ``conftest.py``)."""

from __future__ import annotations

import http.server
import re
import shutil
import sqlite3
import threading
from typing import Any

import pytest
from docs_pages import EXAMPLE_BROKER, ROOT
from kombu import Connection

from amqp_events import events_app
from amqp_events.testing import json_lines, wait_for

#: How getting started runs a worker; the later pages take it as read.
WORKER = "celery -A {} worker --without-mingle --without-heartbeat --without-gossip"

pytestmark = [pytest.mark.guides, pytest.mark.xdist_group("guides")]  # the pages' ports: one process


def test_the_readme_s_twenty_lines(guide):
    readme = guide("README.md")
    # The package alone, no extras: its command is there (and `broker start` made the node these pages use).
    assert "broker" in readme.run("amqp-events --help").stdout
    readme.write("shop.py")
    shop = readme.worker(readme.line("celery -A shop worker"), "shop:billing.invoice.paid")
    readme.run(readme.line("python -c "))
    wait_for(lambda: "invoice 42 paid: 10.00" in shop.log(), 30, what="the handler's print, as the README says")


def test_getting_started_s_two_services(guide):
    start = guide("getting-started.md")
    start.write("orders/celery.py", "orders/handlers.py", "shipping/celery.py", "fire.py")
    orders = start.worker(WORKER.format("orders.celery"), "orders:billing.invoice.paid")
    shipping = start.worker(WORKER.format("shipping.celery"), "shipping:billing.invoice.paid")
    fired = start.run("python fire.py")
    assert re.fullmatch(r"fired billing.invoice.paid [0-9a-f-]{36}\n", fired.stdout)
    wait_for(lambda: "invoice 42 paid: 10.00" in orders.log(), 30, what="orders' handler")
    wait_for(lambda: "courier booked for invoice 42" in shipping.log(), 30, what="shipping's handler")


def test_a_worker_under_watchfiles_runs_the_handler_as_last_saved(guide):
    start = guide("getting-started.md")
    start.write("shipping/celery.py", "fire.py", "orders/celery.py", "orders/handlers.py")
    start.run(start.line("pip install watchfiles"))
    shipping = start.worker(start.line("watchfiles --filter python"), "shipping:billing.invoice.paid")
    code = start.directory / "shipping" / "celery.py"
    code.write_text(code.read_text().replace("courier booked for", "courier called for"))  # the reader saves

    def fired_and_handled_as_saved() -> bool:
        start.run("python fire.py")  # until the worker started again handles it (the old one may take some)
        return "courier called for invoice 42" in shipping.log()

    wait_for(fired_and_handled_as_saved, 60, interval=1.0, what="the handler as saved, after watchfiles restarted")
    assert shipping.is_running()


def test_firing_with_a_key(guide):
    firing = guide("guides/firing.md")
    firing.write("store/celery.py")
    store = firing.worker("celery -A store.celery worker", "store:store.order.placed")  # nothing to --include
    firing.python(
        "from store.celery import order_placed", "order_placed(7, '12.50')", "order_placed(order_id=8, total='1')"
    )
    wait_for(lambda: "order 8 placed (key 8)" in store.log(), 30, what="the handler reading the key")
    assert "order 7 placed (key 7)" in store.log()


def test_ordered_handling(guide, producer):
    ordering = guide("guides/ordering.md")
    ordering.write("accounts/celery.py", "accounts/handlers.py")
    accounts = ordering.worker(WORKER.format("accounts.celery"), "accounts.ordered.00")
    for move in range(6):
        for account_id in (1, 2, 3):
            producer.fire("accounts.money.moved", kwargs={"account_id": account_id, "move": move, "amount": "1"},
                          key=account_id)  # fmt: skip
    for account_id in (1, 2, 3):
        producer.fire("accounts.account.closed", kwargs={"account_id": account_id}, key=account_id)
    wait_for(lambda: accounts.log().count(": closed") == 3, 60, what="every account closed")
    for account_id in (1, 2, 3):
        seen = re.findall(rf"account {account_id}: (move \d|closed)", accounts.log())
        assert seen == [*(f"move {move}" for move in range(6)), "closed"]


def test_a_read_model_catches_up_from_the_history(guide):
    history = guide("guides/history.md")
    history.write("reports/celery.py", "reports/handlers.py")
    billing = events_app("billing", broker_url=EXAMPLE_BROKER, amqp_events_history=True)
    billing.declare_topology()
    for invoice in (1, 2, 3):  # before the reports service exists
        billing.fire("billing.invoice.paid", [invoice, f"{invoice}.00"])
    history.run(history.line("amqp-events -A reports.celery inbox init"))
    replayed = history.run(history.line("amqp-events -A reports.celery history replay"))
    assert "replayed 3 event(s) to reports" in replayed.stdout
    history.worker(history.line("celery -A reports.celery worker"), "reports:billing.invoice.paid")
    billing.fire("billing.invoice.paid", [4, "4.00"])  # live
    billing.close()
    database = sqlite3.connect(history.directory / "reports.sqlite3")

    def paid() -> list[tuple[int, str]]:
        return database.execute("select invoice_id, amount from paid_invoices order by invoice_id").fetchall()

    wait_for(lambda: len(paid()) >= 4, 60, what="the read model caught up and live")
    assert paid() == [(1, "1.00"), (2, "2.00"), (3, "3.00"), (4, "4.00")]
    database.close()


def test_a_middleware_audits_archived_events(guide, producer):
    middleware = guide("guides/middleware.md")
    middleware.write("audit/celery.py")
    middleware.worker(WORKER.format("audit.celery"), "audit:billing.invoice.paid")
    event_id = producer.fire("billing.invoice.paid", [42, "10.00"], {})
    [line] = wait_for(lambda: json_lines(middleware.directory / "archived.jsonl"), 30, what="the audit line")
    assert (line["service"], line["event"], line["id"], line["reason"]) == (
        "audit", "billing.invoice.paid", event_id, "max_retries",
    )  # fmt: skip


def test_an_archived_event_is_listed_shown_and_replayed_after_the_fix(guide):
    archive = guide("guides/archive.md")
    for example in (ROOT / "examples").glob("*.py"):  # the page works from the repository's examples/
        shutil.copy(example, archive.directory)
    journal = {"DEMO_JOURNAL": str(archive.directory / "journal.jsonl")}
    broken = archive.worker(WORKER.format("shipping"), "shipping:billing.invoice.paid", env=journal)
    fired = archive.python("from billing import invoice_paid", "print(invoice_paid(7, '25.00', 'nobody'))")
    event_id = fired.stdout.strip()
    listing, show, replay, final = (
        line.strip()[2:] for line in archive.text.splitlines() if line.strip().startswith("$ ")
    )
    wait_for(lambda: event_id in archive.run(listing).stdout, 30, what="the message in the archive")
    listed = archive.run(listing).stdout
    assert "non_retryable" in listed and "no shipping address for customer 'nobody'" in listed
    assert "PermanentFailure" in archive.run(show.replace(show.split()[-1], event_id)).stdout
    broken.stop()
    shipping = archive.directory / "shipping.py"  # the fix: an address for customer 'nobody'
    shipping.write_text(shipping.read_text().replace("ADDRESSES = {", 'ADDRESSES = {"nobody": "7 New Street", '))
    archive.worker(WORKER.format("shipping"), "shipping:billing.invoice.paid", env=journal)
    assert "replayed 1 message(s)" in archive.run(replay).stdout
    assert "0 archived message(s)" in archive.run(final).stdout
    handled = wait_for(
        lambda: [line for line in json_lines(archive.directory / "journal.jsonl") if line["outcome"] == "handled"],
        30,
        what="the replayed message handled",
    )
    assert [line["id"] for line in handled] == [event_id]


class Bank(http.server.BaseHTTPRequestHandler):
    """The bank API the breakers page's health check asks."""

    def do_GET(self) -> None:  # the name http.server calls
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def bank_up(port: int = 0) -> http.server.HTTPServer:
    server = http.server.HTTPServer(("127.0.0.1", port), Bank)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_health_check_pauses_a_handler_while_the_bank_is_down(guide, producer):
    breakers = guide("guides/sections-and-breakers.md")
    breakers.write("ledger/celery.py")
    bank = bank_up()
    port = bank.server_address[1]
    paid, voided = "ledger:billing.invoice.paid", "ledger:billing.invoice.voided"
    ledger = breakers.worker(WORKER.format("ledger.celery"), paid, voided, env={"BANK_URL": f"http://127.0.0.1:{port}"})

    consumers = breakers.queue
    bank.shutdown()
    bank.server_close()
    wait_for(lambda: consumers(paid)[1] == 0, 40, what="post_to_bank paused: the bank's API is unhealthy")
    producer.fire("billing.invoice.paid", [42, "10.00"], {})
    assert consumers(paid) == (1, 0)  # waiting on the broker, not in the worker
    bank = bank_up(port)
    resumed = lambda: consumers(paid)[0] == 0 and consumers(paid)[1] >= 1  # noqa: E731 (each pool process consumes)
    wait_for(resumed, 40, what="post_to_bank resumed and the event handled")
    bank.shutdown()
    bank.server_close()
    for action, consuming in (("open", False), ("close", True)):
        # Replies wait the whole --wait; a loaded machine can take over 3 s.
        done = breakers.run(f"amqp-events -A ledger.celery breakers {action} void_posting --wait 10")
        assert f"{action}: 1 worker(s)" in done.stdout, done.stdout
        # The worker's processes follow its breakers within a tick (0.1 s).
        wait_for(lambda consuming=consuming: (consumers(voided)[1] > 0) == consuming, 10, what=f"{action} applied")
    assert ledger.is_running()


def test_flow_control_s_backlog_goes_out_at_its_rate_in_a_test_and_on_the_broker(guide, servers):
    flow = guide("guides/flow-control.md")
    flow.write("notifications/celery.py", "tests/test_notifications.py")
    ran = flow.run("python -m pytest -q -p no:cacheprovider", timeout=300, check=False)
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout + ran.stderr
    queue = "notifications:accounts.signed_up"
    notifications = flow.worker(WORKER.format("notifications.celery"), queue)

    def limits(starting: str) -> str:
        return flow.run(flow.line(f"amqp-events -A notifications.celery limits {starting}").split("  #")[0]).stdout

    printed = flow.text.split("On a quiet fleet, `limits show` prints:\n\n```text\n", 1)[1].split("```")[0]
    assert limits("show") == printed  # the guide's example, as the command prints it
    flow.python(
        "from notifications.celery import signed_up", "[signed_up(n, f'user{n}@example.com') for n in range(60)]"
    )

    def waiting() -> int:
        """What waits in the handler's queue (not the one event each pool process holds), as the broker says."""
        with Connection(EXAMPLE_BROKER) as connection:
            return int(connection.default_channel.queue_declare(queue, passive=True).message_count)

    # The backlog waits in its queue, going down one start every 1.2 s, never through the delay ladder.
    first = wait_for(lambda: (found := waiting()) < 60 and found, 30, what="the first starts")
    wait_for(lambda: waiting() <= first - 2, 30, what="two more started, about 2.4 s later")
    ladder = [q for q in servers.broker.queues("/") if q["name"].startswith("notifications.delay.")]
    assert ladder and all(not q.get("messages") and not q.get("message_stats", {}).get("publish") for q in ladder)

    assert "accounts.signed_up: concurrency 5; 20/m (set at run time)" in limits("set send_welcome --rate-limit")
    shown = limits("show")
    assert "concurrency 5; 20/m  (set at run time" in shown and "the last 3 s (paced, 1 at most)" in shown, shown
    assert "accounts.signed_up: 20/m (set at run time)" in limits("set send_welcome --concurrency")
    assert "accounts.signed_up: concurrency 5; 50/m" in limits("set send_welcome --reset")
    assert "set at run time" not in limits("show")
    assert notifications.is_running()


def test_two_services_under_users_of_their_own(guide, servers):
    security = guide("guides/security.md")
    security.write("orders/celery.py", "orders/handlers.py", "shipping/celery.py", "fire.py")
    security.run(security.line("amqp-events -A orders.celery topology declare"))
    security.run(security.line("amqp-events -A shipping.celery topology declare"))
    for service in ("orders", "shipping"):
        applied = security.run(security.line(f"{service.upper()}_PASSWORD="))
        assert f"user {service!r}; its permissions on vhost '/' given" in applied.stdout, applied.stdout
    assert {"orders", "shipping"} <= set(
        security.run(security.line("amqp-events broker ctl list_users")).stdout.split()
    )
    # Printed lines, for a user not made yet: they say to create it first, and run anyway they fail saying why.
    printed = security.run("amqp-events -A shipping.celery topology permissions --user shipping2").stdout
    assert 'rabbitmqctl add_user shipping2 "$PASSWORD"' in printed.splitlines()[1], printed
    refused = security.run("amqp-events broker ctl set_permissions -p / shipping2 '.*' '.*' '.*'", check=False)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "shipping2" in refused.stderr.partition("failed:")[2], refused.stderr  # the reason, not a bare "Error:"
    as_user = "AMQP_EVENTS_SHARED_TOPOLOGY=check CELERY_BROKER_URL=amqp://{0}:{0}-secret@localhost:5672/ celery"
    orders = security.worker(security.line(as_user.format("orders")), "orders:billing.invoice.paid")
    shipping = security.worker(security.line(as_user.format("shipping")), "shipping:billing.invoice.paid")
    wanted = {"orders:billing.invoice.paid": "orders", "shipping:billing.invoice.paid": "shipping"}

    def consumed_as() -> dict[str, str]:
        consumers = servers.broker.request("GET", "/api/consumers/%2F")
        # A consumer the broker is still registering is listed with empty details ([]).
        listed = [row for row in consumers if row["queue"] and row["channel_details"]]
        return {row["queue"]["name"]: row["channel_details"]["user"] for row in listed}

    wait_for(lambda: wanted.items() <= consumed_as().items(), 30, what="each service's queue consumed as its user")
    security.run(security.line(as_user.format("orders").replace(" celery", " python")))
    wait_for(lambda: "invoice 42 paid: 10.00" in orders.log(), 30, what="orders' handler, as orders")
    wait_for(lambda: "courier booked for invoice 42" in shipping.log(), 30, what="shipping's handler, as shipping")
    listed = security.run(security.line(as_user.format("orders").replace(" celery", " amqp-events")))
    assert "0 archived message(s)" in listed.stdout, listed.stdout  # its own archive, read as orders


def test_changing_an_event_is_caught_by_the_check_then_shipped_consumer_first(guide):
    changing = guide("guides/changing-an-event.md")
    changing.write(
        "invoicing/billing.py", "invoicing/shipping.py", "invoicing_next/billing.py", "invoicing_next/shipping.py"
    )
    commands = [
        line.strip() for line in changing.text.splitlines() if line.startswith(("    mkdir ", "    amqp-events "))
    ]
    checks = []
    shipping = None
    for command in commands:
        checking = " contracts check " in command
        done = changing.run(command, check=not checking)
        checks += [done] if checking else []
        if len(checks) == 2 and shipping is None:
            shipping = the_consumer_first(changing)
    assert [done.returncode for done in checks] == [1, 0, 0, 0], [done.stdout for done in checks]
    assert "No message at rest" in checks[-1].stdout
    said = changing.text.split("It exits 1, and says why", 1)[1].split("\n\n")[1]
    assert all(row.strip() in checks[0].stdout for row in said.splitlines()), checks[0].stdout
    assert shipping is not None
    changing.python("from invoicing_next.billing import invoice_paid", "invoice_paid(8, '30.00', 'CHF')")
    wait_for(lambda: "invoice 8: paid 30.00 CHF" in shipping.log(), 30, what="the version-2 event")


def the_consumer_first(changing: Any) -> Any:
    """The consumer's release deployed, then fired at as today's producer fires."""
    shipping = changing.worker(
        "celery -A invoicing_next.shipping worker --loglevel=INFO", "shipping:billing.invoice.paid"
    )
    changing.python("from invoicing.billing import invoice_paid", "invoice_paid(7, '25.00')")
    wait_for(lambda: "invoice 7: paid 25.00 EUR" in shipping.log(), 30, what="the version-1 event, upcast")
    return shipping
