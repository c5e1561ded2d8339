"""Two services, each with its own RabbitMQ user granted exactly what `amqp-events topology permissions` prints,
the shared topology declared by an administrator: each works fully, and neither can reach into the other
(real broker)."""

from __future__ import annotations

import asyncio
import shlex
import uuid
from typing import Any

import pytest
from amqp.exceptions import AccessRefused, NotFound
from console_helpers import Console, call
from helpers import TESTS, wait_archived
from kombu import Connection, Exchange, Queue
from trust_helpers import raw, user_url, users_of

from amqp_events import Reason, events_app
from amqp_events.celery.control import ServiceControl
from amqp_events.errors import PermissionRefused, TopologyMissing
from amqp_events.local.processes import free_port
from amqp_events.testing import wait_for
from amqp_events.topology import delays
from amqp_events.topology.limits import lease_names, limit_prefix, limit_settings

CHECK = {"AMQP_EVENTS_SHARED_TOPOLOGY": "check"}


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
        "set orders' limits at run time (its stream of limits)": on_channel(
            lambda channel: limit_settings("orders")(channel).declare()
        ),
        "write a table to orders' stream of limits": publish("orders.direct", limit_settings("orders").name),
        "hold a lease of orders' flow control": on_channel(
            lambda channel: channel.queue_declare(
                lease_names(limit_prefix("orders", "test.ping"), 1)[0], exclusive=True, auto_delete=False
            )
        ),
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
    other = cli_process("archive", "list", "--service", "shipping", env=cli)  # empty: refused all the same
    assert other.returncode == 1 and "may not read 'shipping.archive'" in other.stderr, other.stdout + other.stderr
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


# -- what another service's user writes into a message ------------------------------------------------------

#: Who owns which event, when ownership is on: ``shipping`` plays the billing service.
OWNERS = "billing.#=shipping,test.#=orders,users.#=orders"


@pytest.fixture(params=["ownership off", "ownership on"])
def owned(request, rabbitmq, broker_url, cli_process) -> Any:
    """``orders`` and ``shipping`` with users of their own, granted what `topology permissions` prints, with
    ownership off or on: ``(urls by service, the services' environment, ownership on?)``."""
    on = request.param == "ownership on"
    env = {"AMQP_EVENTS_EVENT_OWNERSHIP": "1", "AMQP_EVENTS_EVENT_OWNERS": OWNERS} if on else {}
    with users_of(rabbitmq, broker_url, cli_process, ("orders", "shipping"), env) as (urls, fleet):
        yield urls, fleet, on


def test_nothing_another_service_writes_chooses_the_handler_that_runs_its_author_or_its_fate(
    owned, start_worker, records, cli_process, archive_of, broker_url
):
    urls, fleet, on = owned
    env = {"RECORD_FILE": str(records.path), "PYTHONPATH": str(TESTS), "HEARTBEAT_INTERVAL": "1", **CHECK, **fleet}
    orders = start_worker("services.orders", env={**env, "BROKER_URL": urls["orders"]}, cwd=TESTS)
    billing = urls["shipping"]  # another service's own user, under its printed grants
    chained = {"task": "test.orders_only", "args": ["chained"], "kwargs": {}, "subtask_type": None,
               "options": {"queue": "orders:test.orders_only"}, "immutable": False}  # fmt: skip
    paid = "billing.invoice.paid"
    sent = {
        # a handler header naming another handler of orders, and an author claimed
        "a1": ({"task": paid, "for_handler": "test.orders_only", "fired_by": "orders"}, [501, "99999"], None),
        # a task header of another event than the one it was fired as
        "a2": ({"task": "test.orders_only"}, [502, "99999"], None),
        # Celery's embed: a chain and callbacks that name another handler's task and queue
        "a3": ({"task": paid}, [503, "99999"], {"chain": [chained], "callbacks": [chained]}),
    }  # fmt: skip
    for event_id, (headers, args, embed) in sent.items():
        raw(billing, "events", paid, {"id": event_id, **headers}, [args, {}, embed])()
    [ran] = records.wait(1, tag="invoice-501")
    assert (ran["event"], ran["fired_by"], ran["attempt"]) == (paid, "shipping", 1)  # its verified author
    archived = {entry.id: entry for entry in wait_archived(archive_of("orders"), 2)}
    assert (archived["a2"].reason, archived["a3"].reason) == (Reason.MALFORMED_HEADERS, Reason.EMBEDDED_WORKFLOW)
    assert "fired as 'billing.invoice.paid'" in archived["a2"].exception_message
    assert "chain" in archived["a3"].exception_message

    if on:  # the broker refuses another service's events, fired now or through the delay ladder
        assert refused(
            raw(billing, "events", "test.orders_only", {"task": "test.orders_only", "id": "a4"}, [[1], {}, None])
        )
        ladder = delays.routing_key(1, delays.event_destination("test.orders_only"))
        assert refused(
            raw(billing, delays.ENTRY_EXCHANGE, ladder, {"task": "test.orders_only", "id": "a5"}, [[1], {}, None])
        )
        # and orders refuses one whose verified author (here the administrator's user) does not own it
        raw(broker_url, "events", "test.orders_only", {"task": "test.orders_only", "id": "a6"}, [["x"], {}, None])()
        entry = wait_for(lambda: (found := archive_of("orders").get("a6")) and found, 30, what="a6 archived")
        assert entry.reason == Reason.NOT_OWNER and "belongs to 'orders'" in entry.exception_message
    else:  # any service may fire any event, but never as another: as itself, or as nobody (no user_id)
        claim = {"task": "test.orders_only", "fired_by": "orders"}
        raw(billing, "events", "test.orders_only", {**claim, "id": "a4"}, [["claimed"], {}, None])()
        raw(billing, "events", "test.orders_only", {**claim, "id": "a5"}, [["unsigned"], {}, None], signed=False)()
        assert records.wait(1, tag="claimed")[0]["fired_by"] == "shipping"
        assert records.wait(1, tag="unsigned")[0]["fired_by"] is None
    assert not records.all(event="test.orders_only", tag="chained") and not [
        record
        for record in records.all()
        if record["event"] == "test.orders_only" and record["tag"] not in ("claimed", "unsigned")
    ]

    # Heartbeats: a forged one, a malformed one and one that is not JSON change nothing the CLI shows.
    forged = {
        "service": "orders",
        "worker": "forged@nowhere",
        "state": "online",
        "time": 1.0,
        "breakers": {"x": "open"},
    }
    for beat in (forged, [1, 2, 3], b"\xff not json"):
        raw(billing, "amqp_events.heartbeats", "", {}, beat)()
    shown = cli_process("breakers", "--wait", "3", env={**fleet, **CHECK, "BROKER_URL": urls["orders"]})
    assert shown.returncode == 0, shown.stderr
    workers = [line for line in shown.stdout.splitlines() if not line.startswith(" ")]
    assert len(workers) == 1 and workers[0].startswith("w1-") and "forged" not in shown.stdout, shown.stdout
    assert orders.is_running()
