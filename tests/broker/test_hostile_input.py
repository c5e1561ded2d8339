"""Hostile or broken messages put straight into a service's queue: each ends archived with a reason that names
what was wrong (or retried, or run), the worker keeps serving, and nothing stays in a dead-letter buffer
(real broker)."""

from __future__ import annotations

import hashlib
import json
import sys
import urllib.error
import urllib.request
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from helpers import wait_archived
from kombu import Connection

from amqp_events import Reason
from amqp_events.archive import Selection
from amqp_events.testing import wait_for

BODY = b'[["hostile"], {}, null]'
HEADERS = {"task": "test.ping", "id": "hostile-1", "lang": "py", "retries": 0}


def put(broker_url, headers, body=BODY, queue="orders:test.ping", **properties):
    """Publish ``body`` raw into ``queue`` through the default exchange, as any producer could (py-amqp writes
    deep headers recursively: room for them)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
    with Connection(broker_url) as connection:
        channel = connection.default_channel
        message = channel.prepare_message(
            body,
            content_type=properties.pop("content_type", "application/json"),
            content_encoding=properties.pop("content_encoding", "utf-8"),
            headers=headers,
            properties=properties,
        )
        channel.basic_publish(message, exchange="", routing_key=queue)


def still_serving(process, producer, records, tag="still serving"):
    producer.fire("test.ping", [tag], {})
    wait_for(lambda: any(r["tag"] == tag for r in records.all()), 30, what="the worker to run a good event")
    assert process.is_running()


def nested(depth):
    value = "bottom"
    for _ in range(depth):
        value = {"n": value}
    return value


def past(**delta):
    return (datetime.now(timezone.utc) - timedelta(**delta)).isoformat()


def future(**delta):
    return (datetime.now(timezone.utc) + timedelta(**delta)).isoformat()


MALFORMED = {
    "task-a-list": {**HEADERS, "task": ["test.ping"]},
    "task-a-dict": {**HEADERS, "task": {"a": 1}},
    "id-a-dict": {**HEADERS, "id": {"a": 1}},
    "id-a-list": {**HEADERS, "id": [1, 2]},
    "id-too-long": {**HEADERS, "id": "x" * 300},
    "eta-garbage": {**HEADERS, "eta": "tomorrow"},
    "retries-negative": {**HEADERS, "retries": -50},
    "retries-a-string": {**HEADERS, "retries": "many"},
    "nested-600": {**HEADERS, "deep": nested(600)},
    "id-missing": {"task": "test.ping"},
    "x-death-an-int": {**HEADERS, "x-death": 5},
    "x-death-of-strings": {**HEADERS, "x-death": ["rejected"]},
}


#: Headers the receiver decides (Celery's time limits, stamps, ...): dropped where the message enters, whatever they
#: hold, and the event runs.
NOT_A_SENDERS = {
    "eta-past-timelimit-garbage": {**HEADERS, "eta": past(hours=1), "timelimit": "abc"},
    "stamped-headers-garbage": {**HEADERS, "stamped_headers": 5, "stamps": "x"},
    "shadow-and-argsrepr": {**HEADERS, "shadow": "billing.refund", "argsrepr": "('forged',)", "group": ["x"]},
}


@pytest.mark.parametrize(
    "pool", [{"pool": "solo"}, {"pool": "threads", "concurrency": 2}, {"pool": "prefork", "concurrency": 2}],
    ids=["solo", "threads", "prefork"],
)  # fmt: skip
def test_messages_with_malformed_headers_are_archived_and_the_worker_goes_on(
    pool, worker, producer, broker_url, records, archive_of
):
    process = worker("orders", **pool)
    for case, headers in MALFORMED.items():
        put(broker_url, {**headers, "case": case})
    for case, headers in NOT_A_SENDERS.items():
        put(broker_url, {**headers, "id": case}, body=json.dumps([[case], {}, None]).encode())
    archived = wait_archived(archive_of("orders"), len(MALFORMED))
    assert {entry.headers["case"]: entry.reason for entry in archived} == dict.fromkeys(
        MALFORMED, Reason.MALFORMED_HEADERS
    )
    assert all(entry.body == BODY for entry in archived)
    ran = wait_for(lambda: (tags := {r["tag"] for r in records.all()}) >= set(NOT_A_SENDERS) and tags, 30)
    assert ran == set(NOT_A_SENDERS)  # only those: the malformed ones never ran
    still_serving(process, producer, records)


def test_a_header_nested_thousands_deep_does_not_stop_the_worker(worker, producer, broker_url, records, archive_of):
    process = worker("orders")
    put(broker_url, {**HEADERS, "deep": nested(3000)})
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.reason == Reason.MALFORMED_HEADERS
    assert "deep" in archived.exception_message
    still_serving(process, producer, records)


def test_an_expired_message_is_archived_not_dropped(worker, producer, broker_url, records, archive_of):
    process = worker("orders")
    put(broker_url, {**HEADERS, "expires": past(minutes=5)})
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.reason == Reason.EXPIRED and archived.id == "hostile-1"
    assert records.all() == []
    still_serving(process, producer, records)


@pytest.mark.parametrize("expiration", ["0", "50"])
def test_an_amqp_expiration_passed_in_the_queue_lands_in_the_archive_and_replays(
    worker, producer, broker_url, records, archive_of, service_app, expiration
):
    """Dead-lettered straight back to its queue, RabbitMQ would drop it as a cycle (or strand it in the queue's
    dead-letter buffer); the service's dead-letter exchange sends it to the archive instead."""
    service_app("orders").declare_topology()  # no worker yet: nothing takes it before it expires
    put(broker_url, HEADERS, expiration=expiration)
    [archived] = wait_archived(archive_of("orders"), 1)
    assert (archived.reason, archived.id, archived.service) == (Reason.EXPIRED, "hostile-1", "orders")
    assert archived.queue == "orders:test.ping" and archived.archived_at is not None
    assert producer.transport.count("orders:test.ping") == 0
    process = worker("orders")
    assert archive_of("orders").replay().replayed == ["hostile-1"]
    [ran] = records.wait(1)
    assert ran["tag"] == "hostile"
    still_serving(process, producer, records)


def test_an_eta_in_the_future_waits_on_the_broker_not_in_the_worker(worker, producer, broker_url, records):
    process = worker("orders")
    put(broker_url, {**HEADERS, "eta": future(seconds=10)})  # still ahead when the worker takes it, however loaded
    wait_for(lambda: "postponed until its eta event=test.ping" in process.log(), 15, what="the event postponed")
    [ran] = records.wait(1, timeout=30)
    assert ran["tag"] == "hostile" and ran["attempt"] == 1
    assert ran["time"] >= datetime.fromisoformat(future(seconds=0)).timestamp() - 30  # it ran, later
    still_serving(process, producer, records)


def test_an_eta_in_the_past_runs_at_once(worker, producer, broker_url, records):
    worker("orders")
    put(broker_url, {**HEADERS, "eta": past(hours=1)})
    [ran] = records.wait(1)
    assert ran["tag"] == "hostile"


def test_json_with_a_charset_is_json(worker, producer, broker_url, records):
    worker("orders")
    put(broker_url, HEADERS, content_type="application/json; charset=utf-8")
    [ran] = records.wait(1)
    assert ran["tag"] == "hostile"


def test_a_compressed_event_whose_handler_fails_is_retried_not_archived_undecodable(
    worker, producer, broker_url, records, archive_of
):
    worker("orders", env={"MAX_RETRIES": "1", "BACKOFF_MAX": "1"})
    body = zlib.compress(b'[["zipped", {"fail_times": 1}], {}, null]')
    put(broker_url, {**HEADERS, "compression": "application/x-gzip"}, body=body)
    runs = records.wait(2, timeout=30)
    assert [run["attempt"] for run in runs] == [1, 2]


def test_a_zlib_bomb_is_archived_as_too_large_within_bounded_memory(worker, producer, broker_url, records, archive_of):
    process = worker("orders")
    bomb = zlib.compress(b'[["' + b"a" * 300_000_000 + b'"], {}, null]', 9)
    put(broker_url, {**HEADERS, "compression": "application/x-gzip"}, body=bomb)
    [archived] = wait_archived(archive_of("orders"), 1, timeout=60)
    assert archived.reason == Reason.TOO_LARGE and archived.body == bomb
    still_serving(process, producer, records)
    status = Path(f"/proc/{process.pid}/status").read_text()
    rss_kb = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
    assert rss_kb < 400_000, f"the worker grew to {rss_kb} kB"


def test_a_cloud_event_with_an_id_over_amqp_s_limit_is_archived(worker, producer, broker_url, records, archive_of):
    process = worker("orders")
    headers = {"ce-specversion": "1.0", "ce-type": "test.ping", "ce-source": "/x", "ce-id": "i" * 10_000}
    put(broker_url, headers, body=json.dumps({"tag": "ce"}).encode())
    [archived] = wait_archived(archive_of("orders"), 1)
    assert archived.reason == Reason.MALFORMED_HEADERS
    still_serving(process, producer, records)


def put_archived(broker_url, headers, body, content_type=None, content_encoding=None):
    """An odd message in ``orders.archive``, put there by hand (by a buggy tool, or an earlier version)."""
    with Connection(broker_url) as connection:
        channel = connection.default_channel
        message = channel.prepare_message(
            body, content_type=content_type, content_encoding=content_encoding, headers=headers
        )
        channel.basic_publish(message, exchange="", routing_key="orders.archive")


ODD_ARCHIVED = [
    ({"id": "no-type", "task": "test.ping", "archive_reason": "max_retries"}, b"\x00\x01", None, None),
    ({"id": "attempts-abc", "task": "test.ping", "archive_attempts": "abc"}, BODY, "application/json", "utf-8"),
    ({"id": "scalar", "task": "test.ping", "archive_reason": "max_retries"}, b"42", "application/json", "utf-8"),
    ({"id": "true", "task": ["x"], "archived_at": 5}, b"true", "application/json", "utf-8"),
]


def test_odd_entries_in_an_archive_are_shown_not_crashed_on(worker, broker_url, cli_process, console):
    worker("orders")  # declares the archive
    for entry in ODD_ARCHIVED:
        put_archived(broker_url, *entry)
    listing = cli_process("archive", "list")
    assert listing.returncode == 0, listing.stderr
    for headers, *_ in ODD_ARCHIVED:
        assert headers["id"] in listing.stdout
    for headers, *_ in ODD_ARCHIVED:
        shown = cli_process("archive", "show", headers["id"])
        assert shown.returncode == 0, shown.stderr
    exported = cli_process("archive", "export", "-")
    assert exported.returncode == 0 and len(exported.stdout.splitlines()) == len(ODD_ARCHIVED), exported.stderr
    purged = cli_process("archive", "purge", "--yes")
    assert purged.returncode == 0, purged.stderr
    imported = cli_process("archive", "import", "-", input=exported.stdout)  # what was exported comes back whole
    assert imported.returncode == 0, imported.stderr
    again = cli_process("archive", "export", "-")

    def kept(lines: str) -> list[tuple]:
        return sorted((entry["id"], entry["body"], entry["reason"]) for entry in map(json.loads, lines.splitlines()))

    assert kept(again.stdout) == kept(exported.stdout)
    for path in ("/", "/services/orders/archive", "/api/services/orders/archive", "/api/services/orders/archive/true"):
        try:
            urllib.request.urlopen(console.url + path, timeout=30).close()
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{path}: {error}\n{console.output()[-3000:]}") from None


#: Messages a worker once could not archive (it looped or stranded them), and what each ends as now.
UNKEEPABLE = {
    "count-past-int64": ({**HEADERS, "retries": 2**63 - 1}, BODY, Reason.MALFORMED_HEADERS),
    "count-past-int64-failing": ({**HEADERS, "retries": 2**63 - 1}, b'[["x", {"fail_times": 5}], {}, null]',
                                 Reason.MALFORMED_HEADERS),
    "count-unknown-event": ({**HEADERS, "task": "test.nobody", "lost_runs": 2**63 - 1}, BODY, Reason.MALFORMED_HEADERS),
    "name-not-utf8": ({**HEADERS, b"\xff\xfebad": "x"}, BODY, Reason.MALFORMED_HEADERS),
    "headers-120k": ({**HEADERS, "big": "h" * 120_000}, BODY, Reason.TOO_LARGE),
    # too large and malformed at once (found by the fuzz suite): neither may reach the copy
    "big-and-not-utf8": ({**HEADERS, "big": "h" * 90_000, b"\xff": "x"}, BODY, Reason.TOO_LARGE),
    "big-and-long-id": ({**HEADERS, "big": "h" * 90_000, "id": "i" * 300}, BODY, Reason.TOO_LARGE),
    "body-2m": (HEADERS, b'[["' + b"b" * 2_000_000 + b'"], {}, null]', Reason.TOO_LARGE),
    # a handler named by a sender, archived for another reason: the archive says the handler that really ran it,
    # and a replay or the console's edit and retry runs that one
    "named-doomed": ({**HEADERS, "for_handler": "test.orders_only"}, b'[["doomed", {"permanent": true}], {}, null]',
                     Reason.NON_RETRYABLE),
    "embed-chain": (HEADERS, json.dumps([["x"], {}, {"chain": [{"task": "test.orders_only", "args": ["chained"]}]}]
                                        ).encode(), Reason.EMBEDDED_WORKFLOW),
}  # fmt: skip


@pytest.mark.parametrize(
    "pool", [{"pool": "solo"}, {"pool": "threads", "concurrency": 2}, {"pool": "prefork", "concurrency": 2}],
    ids=["solo", "threads", "prefork"],
)  # fmt: skip
def test_what_cannot_be_kept_as_it_came_is_archived_bounded_never_looped_or_stranded(
    pool, worker, producer, broker_url, records, archive_of, rabbitmq, vhost
):
    process = worker("orders", env={"MAX_BODY_BYTES": str(1024 * 1024), "MAX_RETRIES": "1", "BACKOFF_MAX": "1"}, **pool)
    for case, (headers, body, _) in UNKEEPABLE.items():
        own_id = headers["id"] if headers.get("id") != HEADERS["id"] else case  # the case's id, unless it is the case
        put(broker_url, {**headers, "id": own_id, "case": case}, body=body)
    # a header that names a handler of another event: the queue and its event decide
    put(broker_url, {**HEADERS, "id": "named-other", "for_handler": "test.orders_only"}, body=b'[["named"], {}, null]')
    # a delivery count on a first delivery: only the broker counts deliveries, and only on redeliveries
    put(broker_url, {**HEADERS, "id": "counted", "x-delivery-count": 50}, body=b'[["counted"], {}, null]')
    entries = wait_archived(archive_of("orders"), len(UNKEEPABLE), timeout=60)
    archived = {entry.headers["case"]: entry for entry in entries}
    assert {case: entry.reason for case, entry in archived.items()} == {
        case: reason for case, (_, _, reason) in UNKEEPABLE.items()
    }
    assert "'big' (" in archived["headers-120k"].cut and "big" not in archived["headers-120k"].headers
    assert "id" not in archived["big-and-long-id"].headers and b"\xff" not in archived["big-and-not-utf8"].headers
    doomed = archived["named-doomed"]
    assert doomed.handler == "services.orders.on_ping" and "for_handler" not in doomed.headers
    body = UNKEEPABLE["body-2m"][1]
    assert len(archived["body-2m"].body) == 4096 and hashlib.sha256(body).hexdigest() in archived["body-2m"].cut
    assert archive_of("orders").replay(Selection.of(ids=["body-2m"])).cut == ["body-2m"]  # it cannot run again
    records.wait(1, tag="counted")
    [named] = records.wait(1, tag="named")
    assert named["event"] == "test.ping" and not records.all(event="test.orders_only")
    assert not [run for run in records.all() if run["tag"] in ("x", "chained")]
    still_serving(process, producer, records)
    stranded = {q["name"]: q["messages_dlx"] for q in rabbitmq.management.queues(vhost) if q.get("messages_dlx")}
    assert not stranded, stranded


def test_a_flood_of_the_shared_ladder_is_refused_to_its_publisher_never_dropped(broker_url):
    """Each shared queue is bounded by bytes with reject-publish: past the bound the publisher gets a nack (a
    PublishError), and what the queue holds stays."""
    from amqp_events import PublishError, events_app
    from amqp_events.topology import delays

    app = events_app("flood", broker_url=broker_url, amqp_events_shared_queue_max_bytes=20_000,
                     amqp_events_publish_timeout=2)  # fmt: skip
    app.declare_topology()
    level = delays.level_name(10)  # where a fire 1,024 s away waits
    confirmed = 0
    try:
        with pytest.raises(PublishError, match="refused it"):
            for n in range(100):
                app.fire("flood.tick", [n, "x" * 1000], countdown=1024)
                confirmed += 1
        assert 10 <= confirmed < 100 and app.transport.count(level) == confirmed  # nothing it held was dropped
    finally:
        app.close()
