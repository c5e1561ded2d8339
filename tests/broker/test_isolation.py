"""One service cannot reach another through where a message rests and the parts services share: the archive and
its replay, the delay ladder, a pool process's prefetch, Celery's request headers (real broker).

``orders`` (the victim) and ``shipping`` (the attacker, playing the billing service: it owns ``billing.#`` and
``test.ping``, which orders handles) each run under a user of their own with what `topology permissions` prints,
event ownership on. ``test.orders_only`` is orders' own event: no other service may have it run.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import TESTS, wait_archived
from kombu import Connection
from trust_helpers import raw, users_of

from amqp_events import Reason, events_app
from amqp_events.local.processes import free_port
from amqp_events.testing import wait_for
from amqp_events.topology import delays

OWNERS = "test.ping=shipping,billing.#=shipping,test.#=orders,users.#=orders"
CHECK = {"AMQP_EVENTS_SHARED_TOPOLOGY": "check"}
PAID = "billing.invoice.paid"
#: What a sender writes to pass its message off as something the broker or the victim's worker wrote.
FORGED = {
    "x-death": [{"queue": "orders:test.orders_only", "reason": "expired", "count": 1, "exchange": "events"}],
    "x-first-death-queue": "orders:test.orders_only",
    "x-first-death-reason": "expired",
    "archive_queue": "orders:test.orders_only",
    "archive_task": "test.orders_only",
    "archive_reason": "max_retries",
    "archive_service": "orders",
    "for_handler": "test.orders_only",
    "fired_by": "orders",
}


@pytest.fixture
def fleet(request, rabbitmq, broker_url, cli_process) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """``(urls, environment)`` of ``orders`` and ``shipping`` under users of their own, ownership on (more of their
    environment when parametrized indirectly: the queue layout, the ladder)."""
    env = {"AMQP_EVENTS_EVENT_OWNERSHIP": "1", "AMQP_EVENTS_EVENT_OWNERS": OWNERS, **getattr(request, "param", {})}
    with users_of(rabbitmq, broker_url, cli_process, ("orders", "shipping"), env) as found:
        yield found


def orders_worker(start_worker: Any, records: Any, fleet: Any, **options: Any) -> Any:
    urls, env = fleet
    extra = options.pop("env", {})
    environment = {"RECORD_FILE": str(records.path), "PYTHONPATH": str(TESTS), **env, **CHECK, **extra,
                   "BROKER_URL": urls["orders"]}  # fmt: skip
    return start_worker("services.orders", env=environment, cwd=TESTS, **options)


def orders_archive(fleet: Any) -> Any:
    """Orders' archive as its operator reads it (its own user, the fleet's table of users)."""
    urls, env = fleet
    app = events_app(
        "orders", broker_url=urls["orders"], amqp_events_shared_topology="check",
        amqp_events_service_users=dict(pair.split("=") for pair in env["AMQP_EVENTS_SERVICE_USERS"].split(",")),
    )  # fmt: skip
    return app.archive()


def fire_as_orders(urls: dict[str, str], tag: str, kwargs: dict[str, Any] | None = None) -> None:
    """Orders fires its own ``test.orders_only`` (with its own user)."""
    own = events_app("orders", broker_url=urls["orders"], amqp_events_shared_topology="check")
    try:
        own.fire("test.orders_only", [tag], kwargs or {})
    finally:
        own.close()


def replayed_by_orders(cli_process: Any, fleet: Any) -> None:
    urls, env = fleet
    done = cli_process("archive", "replay", "--yes", env={**env, **CHECK, "BROKER_URL": urls["orders"]})
    assert done.returncode == 0, done.stderr


LAYOUTS = [
    pytest.param({}, id="per_handler"),
    pytest.param({"AMQP_EVENTS_QUEUE_LAYOUT": "per_service"}, id="per_service"),
]
PER_SERVICE = "orders.events"


# -- the archive and its replay ------------------------------------------------------------------------------


@pytest.mark.parametrize("fleet", LAYOUTS, indirect=True)
def test_an_expired_event_with_forged_death_headers_is_archived_as_the_broker_saw_it_and_replays_as_it_was_routed(
    fleet, cli_process, start_worker, records
):
    urls, env = fleet
    shared = env.get("AMQP_EVENTS_QUEUE_LAYOUT") == "per_service"
    # Orders' worker is down: the event expires in orders' queue, and the broker dead-letters it to the archive.
    # (On RabbitMQ 3.10 the sender's x-first-death-queue routes it: a queue of orders' that is not the one it
    # expired in, or in the per-service layout the one queue, for a dead letter to reach the archive at all.)
    claimed = {"x-first-death-queue": PER_SERVICE} if shared else {}
    headers = {"task": "test.orders_only", "id": "x1", **FORGED, **claimed}
    raw(urls["shipping"], "events", PAID, headers, [[1070, "777777"], {}, None], expiration="200")()
    [entry] = wait_archived(orders_archive(fleet), 1)
    queue = PER_SERVICE if shared else f"orders:{PAID}"
    assert (entry.reason, entry.queue, entry.fired_by, entry.service) == (Reason.EXPIRED, queue, "shipping", "orders")
    assert entry.dead_lettered and entry.attempts == 0
    if not shared:  # its queue is one handler's: that handler, and its event, are what the broker verified
        assert (entry.task, entry.event) == (PAID, PAID)

    orders_worker(start_worker, records, fleet)
    replayed_by_orders(cli_process, fleet)
    if shared:  # the shared queue: its task header is only a claim, judged again with its verified author
        [again] = wait_for(lambda: [e for e in orders_archive(fleet).list() if e.reason == Reason.NOT_OWNER], 30)
        assert "fired by 'shipping'" in again.exception_message
    else:  # the handler of the event the broker routed runs, with its verified author
        [ran] = records.wait(1, tag="invoice-1070")
        assert (ran["event"], ran["fired_by"]) == (PAID, "shipping")
    assert not records.all(event="test.orders_only")


@pytest.mark.parametrize("fleet", LAYOUTS, indirect=True)
def test_a_task_header_of_another_event_is_judged_again_when_its_archived_copy_is_replayed(
    fleet, cli_process, start_worker, records
):
    urls, _ = fleet
    orders_worker(start_worker, records, fleet)
    raw(urls["shipping"], "events", PAID, {"task": "test.orders_only", "id": "x2"}, [[1400], {}, None])()
    [entry] = wait_archived(orders_archive(fleet), 1)
    assert (entry.reason, entry.fired_by, entry.task) == (Reason.MALFORMED_HEADERS, "shipping", "")
    replayed_by_orders(cli_process, fleet)
    again = wait_for(lambda: [e for e in orders_archive(fleet).list() if e.headers.get("replayed_by")], 30)
    assert [e.reason for e in again] == [Reason.MALFORMED_HEADERS]
    assert "fired as 'billing.invoice.paid'" in again[0].exception_message
    assert not records.all(event="test.orders_only")


# -- the delay ladder ----------------------------------------------------------------------------------------

SMALL_LADDER = {"SHARED_QUEUE_MAX_BYTES": str(256 * 1024)}
#: A retry that waits 600 s: it enters the ladder at level 9 (512 s), the level the attacker fills.
LONG_RETRY = {"retry_with": {"countdown": 600}}


def fill_shared_level(url: str, level: int) -> int:
    """Publish as the user of ``url`` (to its own queue, through the shared ladder) until ``level`` refuses;
    returns how many it took."""
    key = delays.routing_key(2**level, delays.queue_destination("shipping:test.ping"))
    body = b"x" * 32 * 1024
    taken = 0
    with Connection(url, transport_options={"confirm_publish": True}) as connection:
        channel = connection.default_channel
        while True:
            message = channel.prepare_message(body, None, "application/octet-stream", "binary", {"id": "flood"})
            try:
                channel.basic_publish(message, exchange=delays.ENTRY_EXCHANGE, routing_key=key)
            except Exception:  # the nack: the level is full
                return taken
            taken += 1


@pytest.mark.parametrize("fleet", [SMALL_LADDER], indirect=True, ids=["own ladder"])
def test_a_service_filling_a_shared_ladder_level_refuses_none_of_another_s_retries(
    fleet, start_worker, records, rabbitmq, vhost
):
    urls, _ = fleet
    assert 0 < fill_shared_level(urls["shipping"], 9) < 20
    orders_worker(start_worker, records, fleet)
    fire_as_orders(urls, "retried", {"how": LONG_RETRY})
    records.wait(1, tag="retried")
    # The retry waits in orders' own ladder, which shipping's user cannot write to.
    level = delays.own_level_name("orders", 9)
    wait_for(
        lambda: (rabbitmq.management.queue(vhost, level) or {}).get("messages") == 1 or None,
        30,
        what=f"a wait in {level}",
    )
    assert orders_archive(fleet).count() == 0


@pytest.mark.parametrize("fleet", [{**SMALL_LADDER, "AMQP_EVENTS_DELAY_LADDER": "shared"}], indirect=True,
                         ids=["shared ladder"])  # fmt: skip
def test_with_the_shared_ladder_a_refused_retry_is_archived_saying_so_never_sent_round_again(
    fleet, start_worker, records
):
    urls, _ = fleet
    fill_shared_level(urls["shipping"], 9)
    orders_worker(start_worker, records, fleet, env={"PUBLISH_TIMEOUT": "2"})
    fire_as_orders(urls, "refused", {"how": LONG_RETRY})
    [entry] = wait_archived(orders_archive(fleet), 1)
    assert entry.reason == Reason.DELAY_REFUSED and entry.exception_type.endswith("PublishRefused")
    assert "amqp_events.delay.21" in entry.exception_message and entry.attempts == 1
    fire_as_orders(urls, "after")  # runs after the refused one was settled: a loop would have run it again first
    records.wait(1, tag="after")
    assert len(records.all(tag="refused")) == 1


# -- a pool process's prefetch -------------------------------------------------------------------------------


def test_poison_in_a_shared_process_is_archived_after_its_own_limit_and_what_waited_behind_it_runs(
    fleet, start_worker, records
):
    urls, _ = fleet
    for n in range(4):  # shipping's poison: each kills the process that runs it
        raw(urls["shipping"], "events", "test.ping", {"task": "test.ping", "id": f"p{n}"},
            [[f"poison-{n}"], {"how": {"kill": True}}, None])()  # fmt: skip
    # Orders' own events, in a queue its process consumes after the poison's (queues are consumed by name).
    own = events_app("orders", broker_url=urls["orders"], amqp_events_shared_topology="check")
    try:
        for n in range(10):
            own.fire("users.registered", [], {"user_id": n, "email": f"{n}@example.com"})
    finally:
        own.close()
    orders_worker(start_worker, records, fleet, pool=None, concurrency=1)  # `celery worker -c 1` as typed
    poison = {f"p{n}" for n in range(4)}
    # A process that archived a poison and then died of the next one may take the first one's ack along: that one
    # is archived again (at least once, as any message whose ack was lost). So: until each is there.
    archive = orders_archive(fleet)

    def each_poison() -> list[Any] | None:
        found = archive.list()
        return found if {entry.id for entry in found} >= poison else None

    archived = wait_for(each_poison, 120, what="each poison archived")
    assert {entry.id for entry in archived} == poison and {entry.reason for entry in archived} == {Reason.WORKER_LOST}
    assert all("died (3 time(s) so far)" in entry.exception_message for entry in archived)
    ran = records.wait(10, event="users.registered", timeout=60)
    # Each ran, none archived (one that ran just before a kill may run again: its ack may have gone with it).
    assert {run["tag"] for run in ran} == {f"user-{n}" for n in range(10)}


# -- Celery's request headers --------------------------------------------------------------------------------


@pytest.mark.parametrize("pool", [{"pool": "prefork"}, {"pool": None}], ids=["prefork", "default"])
def test_a_sender_s_celery_time_limits_are_not_the_handler_s(pool, fleet, start_worker, records):
    urls, _ = fleet
    # Each handler of orders has a soft time limit of 1 s here (and no hard one); one process runs one at a time.
    orders_worker(start_worker, records, fleet, env={"TIME_LIMIT": "1", "MAX_RETRIES": "0"}, concurrency=1, **pool)
    sent = {
        "t1": ([100000, 100000], 2.0),  # [hard, soft] a day each, for a run of 2 s
        "t2": ([0.2, 0.1], 0.25),  # a tenth of a second, for a run of 0.25 s (well within the handler's 1 s)
        "t3": (None, 0),  # runs after both
    }
    for event_id, (limits, sleep) in sent.items():
        headers = {"task": "test.ping", "id": event_id, **({"timelimit": limits} if limits else {})}
        raw(urls["shipping"], "events", "test.ping", headers, [[event_id], {"how": {"sleep": sleep}}, None])()
    records.wait(1, tag="t3")  # t1 and t2 were settled before it began
    [entry] = orders_archive(fleet).list()
    assert entry.id == "t1" and entry.exception_type.endswith("SoftTimeLimitExceeded")  # the handler's 1 s held


# -- the health probes' port ---------------------------------------------------------------------------------


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def test_idle_connections_to_the_health_port_are_bounded(worker, records):
    port = free_port()
    process = worker("orders", env={"AMQP_EVENTS_HEALTH_PORT": str(port)})
    before = threads_of(process.pid)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    try:
        for connection in idle:
            connection.setblocking(False)
        # Past the bound, the server closes each at once: wait until it did so for every one past it.
        wait_for(lambda: sum(map(closed_by_peer, idle)) >= 200 - 16 or None, 30, what="the connections past the bound")
        assert threads_of(process.pid) <= before + 16
    finally:
        for connection in idle:
            connection.close()
    # The probes answer again (the idle ones held their place for 5 s at most).
    wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2).status == 200, 15)


def closed_by_peer(connection: socket.socket) -> bool:
    try:
        return connection.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
