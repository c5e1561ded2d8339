"""Two services, each with its own RabbitMQ user granted exactly what `amqp-events topology permissions` prints,
the shared topology declared by an administrator: each works fully, and neither can reach into the other
(real broker)."""

from __future__ import annotations

import asyncio
import shlex
import urllib.parse
import uuid
from typing import Any

import pytest
from amqp.exceptions import AccessRefused, NotFound
from console_helpers import Console, call
from helpers import TESTS, wait_archived
from kombu import Connection, Exchange, Queue

from amqp_events import events_app
from amqp_events.celery.control import ServiceControl
from amqp_events.errors import PermissionRefused, TopologyMissing
from amqp_events.local.processes import free_port
from amqp_events.testing import wait_for
from amqp_events.topology import delays

CHECK = {"AMQP_EVENTS_SHARED_TOPOLOGY": "check"}


def user_url(broker_url: str, user: str, password: str) -> str:
    parts = urllib.parse.urlsplit(broker_url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def users(rabbitmq, vhost, broker_url, cli_process) -> dict[str, str]:
    """``{"orders": url, "shipping": url}``: a user per service, granted what `topology permissions` prints for
    it (run as printed), after an administrator (guest) declared each service's topology."""
    if rabbitmq.node is None:
        pytest.skip("creating users needs the harness's own node (rabbitmqctl)")
    urls, made = {}, []
    for service in ("orders", "shipping"):
        user, password = f"{service}-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        rabbitmq.node.rabbitmqctl("add_user", user, password)
        made.append(user)
        declared = cli_process("topology", "declare", app=f"services.{service}")
        assert declared.returncode == 0, declared.stderr
        printed = cli_process("topology", "permissions", "--user", user, app=f"services.{service}")
        assert printed.returncode == 0, printed.stderr
        for line in printed.stdout.splitlines():
            if line.startswith("rabbitmqctl "):
                rabbitmq.node.rabbitmqctl(*shlex.split(line)[1:])
        urls[service] = user_url(broker_url, user, password)
    yield urls
    for user in made:
        rabbitmq.node.rabbitmqctl("delete_user", user)


async def fired_from_a_coroutine(app: Any, event: str, args: list[Any]) -> str:
    try:
        return str(await app.fire_async(event, args, {}))
    finally:
        await app.close_async()


def refused(action: Any) -> bool:
    """Did the broker refuse ``action`` (403, or 404 for what the user may not even see)?"""
    try:
        action()
    except (AccessRefused, NotFound, PermissionRefused, TopologyMissing):
        return True
    return False


def attempts(url: str) -> dict[str, Any]:
    """What another service's user might try against ``orders``, each on a channel of its own."""

    def on_channel(do: Any) -> Any:
        def run() -> None:
            with Connection(url, transport_options={"confirm_publish": True}) as connection:
                do(connection.channel())

        return run

    def publish(exchange: str, routing_key: str) -> Any:
        def do(channel: Any) -> None:
            body, headers = b'[["injected"], {}, null]', {"task": "test.ping", "id": "x"}
            message = channel.prepare_message(body, None, "application/json", "utf-8", headers)
            channel.basic_publish(message, exchange=exchange, routing_key=routing_key)

        return on_channel(do)

    ladder_key = delays.routing_key(1, delays.queue_destination("orders:test.ping"))
    stolen = f"shipping:stolen-{uuid.uuid4().hex[:6]}"
    return {
        "inject into orders' archive (default exchange)": publish("", "orders.archive"),
        "inject into orders' queue (default exchange)": publish("", "orders:test.ping"),
        "inject through orders' direct exchange": publish("orders.direct", "orders.archive"),
        "send a 'retry' to orders through the ladder": publish(delays.ENTRY_EXCHANGE, ladder_key),
        "take from orders' queue": on_channel(lambda channel: channel.basic_get("orders:test.ping")),
        "purge orders' archive": on_channel(lambda channel: channel.queue_purge("orders.archive")),
        "take a pending retry from the ladder": on_channel(lambda channel: channel.basic_get(delays.level_name(0))),
        "delete a ladder queue": on_channel(lambda channel: channel.queue_delete(delays.level_name(21))),
        "purge the unroutable queue": on_channel(lambda channel: channel.queue_purge(delays.UNROUTABLE)),
        "delete the events exchange": on_channel(lambda channel: channel.exchange_delete("events")),
        "copy orders' retries to its own queue": on_channel(
            lambda channel: Queue(
                stolen,
                Exchange(delays.DELIVERY_EXCHANGE, "topic", passive=True),
                delays.destination_pattern("queue.orders:test.ping"),
                durable=False,
                channel=channel,
            ).declare()
        ),
        "control orders' workers": publish("orders.control.pidbox", ""),
    }


def seen_by_console(url: str, rabbitmq: Any, archived: str) -> None:
    """The console of ``orders`` on its own user: its archive listed, another service's refused clearly."""
    env = {"PYTHONPATH": str(TESTS), "BROKER_URL": url, **CHECK}
    console = Console(url, rabbitmq.management.base_url, f"127.0.0.1:{free_port()}", env=env, app="services.orders")
    try:
        console.wait_serving(console.url + "/api/services")
        status, listing = call(console.url + "/api/services/orders/archive")
        assert status == 200 and [entry["id"] for entry in listing["messages"]] == [archived], listing
        status, answer = call(console.url + "/api/services/shipping/archive")
        assert status == 403 and "may not read 'shipping.archive'" in answer["error"], answer
        # The overview reads the archives it may and says which it may not; its own is indexed.
        rows = {row["service"]: row for row in call(console.url + "/api/fleet")[1]["services"]}
        assert "may not read 'shipping.archive'" in rows["shipping"]["archive_unreadable"]
        assert rows["orders"]["archive_unreadable"] is None and rows["orders"]["archived"] == 1
    finally:
        console.stop()


def test_each_service_works_with_its_own_grants_and_cannot_reach_into_the_other(
    users, start_worker, records, cli_process, archive_of, rabbitmq
):
    env = {"RECORD_FILE": str(records.path), "PYTHONPATH": str(TESTS), "MAX_RETRIES": "1", **CHECK}
    orders = start_worker("services.orders", env={**env, "BROKER_URL": users["orders"]}, cwd=TESTS)
    start_worker("services.shipping", env={**env, "BROKER_URL": users["shipping"]}, cwd=TESTS)
    fires = events_app("orders", broker_url=users["orders"], amqp_events_shared_topology="check")
    try:
        fires.fire("test.ping", ["both"], {})
        fires.fire("test.ping", ["retried"], {"how": {"fail_times": 1, "only": "orders"}})
        fires.fire("test.ping", ["doomed"], {"how": {"permanent": True}})
        asyncio.run(fired_from_a_coroutine(fires, "test.ping", ["async"]))  # the same grants from asyncio
        wait_for(lambda: {(r["service"], r["tag"], r["attempt"]) for r in records.all()} >= {
            ("orders", "both", 1), ("shipping", "both", 1), ("orders", "retried", 2), ("orders", "doomed", 1),
            ("orders", "async", 1), ("shipping", "async", 1),
        } or None, 60, what="both services handling, orders' retry back through the ladder")  # fmt: skip
    finally:
        fires.close()
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.payload[0][0] == "doomed"

    # Shipping's user tries everything it should not: the broker refuses each.
    for what, attempt in attempts(users["shipping"]).items():
        assert refused(attempt), f"shipping's user could {what}"
    steering = events_app("shipping", broker_url=users["shipping"], amqp_events_shared_topology="check")
    try:
        assert refused(lambda: ServiceControl(steering, "orders").broadcast("shutdown")), "stop orders' workers"
        assert refused(lambda: steering.archive("orders").list()), "read orders' archive"
    finally:
        steering.close()

    # Orders still works, with its own user's console and CLI too: the archive, breakers, replay.
    assert orders.is_running()
    seen_by_console(users["orders"], rabbitmq, archived.id)
    cli = {"BROKER_URL": users["orders"], **CHECK}
    paused = cli_process("breakers", "open", "on_ping", "--wait", "10", env=cli)
    assert paused.returncode == 0 and "on_ping" in paused.stdout, paused.stderr
    resumed = cli_process("breakers", "close", "on_ping", "--wait", "10", env=cli)
    assert resumed.returncode == 0, resumed.stderr
    replayed = cli_process("archive", "replay", "--yes", env=cli)
    assert replayed.returncode == 0, replayed.stderr
    wait_for(lambda: [r for r in records.all() if r["tag"] == "doomed" and r["attempt"] == 1][1:] or None, 30,
             what="the replayed event handled again")  # fmt: skip


@pytest.fixture
def ledger_user(rabbitmq, broker_url, cli_process) -> Any:
    """A user for the ``ledger`` service (ordered handlers, history kept) from `topology permissions`."""
    if rabbitmq.node is None:
        pytest.skip("creating users needs the harness's own node (rabbitmqctl)")
    user, password = f"ledger-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rabbitmq.node.rabbitmqctl("add_user", user, password)
    admin = {"HISTORY": "1"}
    assert cli_process("topology", "declare", app="services.ledger", env=admin).returncode == 0
    printed = cli_process("topology", "permissions", "--user", user, app="services.ledger", env=admin)
    for line in printed.stdout.splitlines():
        if line.startswith("rabbitmqctl "):
            rabbitmq.node.rabbitmqctl(*shlex.split(line)[1:])
    yield user_url(broker_url, user, password)
    rabbitmq.node.rabbitmqctl("delete_user", user)


def test_ordered_handlers_and_the_history_work_with_the_service_s_own_grants(
    ledger_user, start_worker, records, cli_process
):
    env = {"RECORD_FILE": str(records.path), "PYTHONPATH": str(TESTS), "HISTORY": "1", "BROKER_URL": ledger_user,
           **CHECK}  # fmt: skip
    start_worker("services.ledger", env=env, cwd=TESTS)
    fires = events_app("ledger", broker_url=ledger_user, amqp_events_shared_topology="check")
    try:
        fires.fire("accounts.account.opened", [], {"account": "a", "seq": 1, "how": {"fail_times": 1}}, key="a")
        fires.fire("accounts.money.moved", [], {"account": "a", "seq": 2}, key="a")
    finally:
        fires.close()
    runs = wait_for(lambda: [r for r in records.all() if r.get("ok")][1:] and records.all(), 60,
                    what="both events of account a handled")  # fmt: skip
    assert [(r["seq"], r["ok"]) for r in runs] == [(1, False), (1, True), (2, True)]  # in order, through a retry
    cli = {"BROKER_URL": ledger_user, "HISTORY": "1", **CHECK}
    stats = cli_process("history", "stats", app="services.ledger", env=cli)
    assert stats.returncode == 0 and "accounts.account.opened" in stats.stdout, stats.stderr
    replayed = cli_process("history", "replay", "--since", "1h", "--yes", app="services.ledger", env=cli)
    assert replayed.returncode == 0, replayed.stderr
    wait_for(lambda: len([r for r in records.all() if r.get("ok")]) >= 4 or None, 60, what="the replay handled")
