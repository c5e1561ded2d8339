"""The pages that install an extra: testing, the outbox, exactly-once effects, tracing, other languages. Each
runs as its reader runs it, with only what the page installs (see ``conftest.py``)."""

from __future__ import annotations

import os
import re
import shutil
import signal

import pytest
from docs_pages import named_blocks
from process_helpers import printed

from amqp_events.local.processes import port_is_free
from amqp_events.testing import wait_for

pytestmark = [pytest.mark.guides, pytest.mark.xdist_group("guides")]  # the pages' ports: one process


def test_the_testing_guide_s_tests_pass_with_plain_pytest(guide):
    testing = guide("guides/testing.md")
    [pyproject] = re.findall(r"```toml\n# pyproject.toml\n(.*?)```", testing.text, flags=re.S)
    (testing.directory / "pyproject.toml").write_text(pyproject)
    tests = ["tests/conftest.py", "tests/test_invoices.py", "tests/test_payments.py", "tests/test_with_workers.py"]
    testing.write(*tests, "orders/celery.py", "orders/handlers.py", "shipping/celery.py", "payments/handlers.py")
    testing.write("tests/test_capture.py")  # the sections page's test, run as this page runs tests
    ran = testing.run("pytest -q -p no:cacheprovider", timeout=300, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"{len(tests) + 2} passed" in ran.stdout, ran.stdout  # test_invoices.py holds two, test_capture.py two


def test_the_outbox_publishes_what_a_transaction_committed(guide, databases):
    outbox = guide("guides/outbox.md")
    outbox.write("shop/celery.py", "shop/checkout.py", "orders/celery.py", "orders/handlers.py")
    orders = outbox.worker(
        "celery -A orders.celery worker --without-mingle --without-heartbeat --without-gossip",
        "orders:billing.invoice.paid",
    )
    outbox.run(outbox.line("amqp-events -A shop.celery outbox init"))
    relay = outbox.start(outbox.line("amqp-events -A shop.celery outbox relay"))
    outbox.python("from shop.checkout import pay", "pay(42, '10.00')")
    wait_for(lambda: "invoice 42 paid: 10.00" in orders.log(), 30, what="orders' handler of the paid invoice")
    relay.terminate()
    _, said = relay.communicate(timeout=30)
    assert relay.returncode == 0, said  # it stops cleanly on SIGTERM, as the page says


def test_an_inbox_and_a_dedup_store_skip_the_second_copy(guide, databases, redis_as_written, producer):
    once = guide("guides/exactly-once.md")
    once.write("payments/celery.py", "mailer/celery.py")
    once.run(once.line("amqp-events -A payments.celery inbox init"))
    once.python(
        "from payments.celery import Base, sessions", "Base.metadata.create_all(sessions.kw['bind'])"
    )  # migrations
    worker = "celery -A {}.celery worker --without-mingle --without-heartbeat --without-gossip"
    assert "logged at INFO (`duplicate skipped" in once.text
    payments = once.worker(worker.format("payments"), "payments:billing.invoice.paid", flags=("--loglevel=INFO",))
    mailer = once.worker(worker.format("mailer"), "mailer:billing.invoice.paid", flags=("--loglevel=INFO",))
    message = producer.event_message("billing.invoice.paid", [42, "10.00"], {})

    def payments_recorded() -> int:
        counted = once.python(
            "from payments.celery import sessions",
            "from sqlalchemy import text",
            "print(sessions().execute(text('select count(*) from payments')).scalar_one())",
        )
        return int(counted.stdout)

    producer.transport.publish(message)
    wait_for(lambda: "receipt for invoice 42 sent" in mailer.log() and payments_recorded() == 1, 30, what="the effects")
    # The same message again, as after a lost ack (two copies at the same moment are another matter: the page says
    # a dedup store does not cover them).
    producer.transport.publish(message)
    for each in (payments, mailer):
        wait_for(lambda each=each: "duplicate skipped" in each.log(), 30, what="the second copy skipped")
    assert mailer.log().count("receipt for invoice 42 sent") == 1
    assert payments_recorded() == 1


def test_spans_of_firing_and_handling(guide):
    tracing = guide("guides/tracing-and-logs.md")
    tracing.write("telemetry.py", "orders/celery.py", "orders/handlers.py")
    module = tracing.directory / "orders" / "celery.py"
    module.write_text("import telemetry  # noqa: F401\n" + module.read_text())  # as the page says
    assert "`import telemetry` at the top of `orders/celery.py`" in tracing.text
    orders = tracing.worker(
        "celery -A orders.celery worker --without-mingle --without-heartbeat --without-gossip",
        "orders:billing.invoice.paid",
    )
    fired = tracing.python("from orders.celery import invoice_paid", "invoice_paid(42, '10.00')")
    assert '"name": "publish billing.invoice.paid"' in fired.stdout  # exported when the process exits
    wait_for(lambda: '"name": "process billing.invoice.paid"' in orders.log(), 30, what="the worker's span")
    assert '"amqp_events.outcome": "success"' in orders.log()


def test_node_services_fire_and_read_cloud_events(guide):
    interop = guide("guides/interop.md")
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("Node.js and npm are not installed on this machine: the page's other half needs them")
    interop.write("orders/celery.py", "orders/handlers.py", "billing/celery.py")
    scripts = {name: body for _, name, body in named_blocks("javascript", "//")}
    assert set(scripts) == {"fire-invoice.js", "read-invoices.js"}
    for name, body in scripts.items():
        (interop.directory / name).write_text(body)
    [packages] = set(re.findall(r"\(npm install ([\w ]+)\)", interop.text))
    interop.run(f"npm install --no-audit --no-fund {packages}", timeout=300)
    orders = interop.worker(
        "celery -A orders.celery worker --without-mingle --without-heartbeat --without-gossip",
        "orders:billing.invoice.paid",
    )
    interop.run("node fire-invoice.js")
    wait_for(lambda: "invoice 42 paid: 10.00" in orders.log(), 30, what="orders handling the Node event")

    reader = interop.start("node read-invoices.js")
    assert printed(reader, 1, timeout=30) == ["waiting for invoices"]
    interop.python(
        "from billing.celery import invoice_paid as paid", "paid(7, '7.00')", "paid.fire((8, '8.00'), countdown=1)"
    )
    lines = printed(reader, 2, timeout=30)
    assert [line.split(": ", 1)[1] for line in lines] == [
        '{"invoice_id":7,"amount":"7.00"}',
        '{"invoice_id":8,"amount":"8.00"}',
    ]
    assert all(line.startswith("billing.invoice.paid ") and " from billing at " in line for line in lines)
    wait_for(lambda: "invoice 8 paid: 8.00" in orders.log(), 30, what="orders handling billing's CloudEvents too")


def test_a_fastapi_service_fires_from_its_transaction_and_a_coroutine_handler_calls_another_service(
    guide, databases, api_ports
):
    asyncio_page = guide("guides/asyncio.md")
    asyncio_page.write("storefront/celery.py", "storefront/api.py", "fulfilment/celery.py", "stock/api.py")
    asyncio_page.run(asyncio_page.line("amqp-events -A storefront.celery outbox init"))
    serve_stock = asyncio_page.line("uvicorn stock.api:api")
    stock = asyncio_page.start(serve_stock)
    asyncio_page.start(asyncio_page.line("uvicorn storefront.api:api"))
    worker = asyncio_page.worker(
        asyncio_page.line("celery -A fulfilment.celery worker"), "fulfilment:shop.order.placed"
    )
    wait_for(lambda: not any(map(port_is_free, api_ports)), 60, what="both APIs serving")
    place, refuse = [line.strip() for line in asyncio_page.text.splitlines() if line.strip().startswith("python -c")]
    assert "<Response [201 Created]>" in asyncio_page.run(place).stdout
    wait_for(lambda: "order 1: 2 x tea reserved" in worker.log(), 30, what="the stock reserved by the handler")
    assert "<Response [422 Unprocessable Entity]>" in asyncio_page.run(refuse).stdout

    os.killpg(stock.pid, signal.SIGTERM)  # the stock service down: the handler's call fails, retried on the broker
    stock.communicate(timeout=30)
    assert "<Response [201 Created]>" in asyncio_page.run(place).stdout
    wait_for(lambda: "retrying event=shop.order.placed" in worker.log(), 30, what="the failed call retried")
    asyncio_page.start(serve_stock)
    wait_for(lambda: worker.log().count("2 x tea reserved") == 2, 60, what="the order reserved once it is back")
    assert "500 x tea" not in worker.log()  # the refused order was never fired
