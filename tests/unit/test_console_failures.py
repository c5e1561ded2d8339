"""Failures grouped by cause, the console's index of an archive, the fleet's rows and the event log."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from amqp_events import PermanentFailure, Reason
from amqp_events.archive.grouping import Cause, Failure, frames, grouped, masked
from amqp_events.archive.reasons import MEANINGS
from amqp_events.celery import events_app
from amqp_events.console.audit import AuditTrail
from amqp_events.console.discovery import QueueState, ServiceQueues
from amqp_events.console.index import ArchiveIndex, Entry, Snapshot
from amqp_events.console.overview import by_urgency, folded, service_row
from amqp_events.console.pages import chart
from amqp_events.console.watch import Reading
from amqp_events.history.replay import Cursor
from amqp_events.testing import in_process

URL = "amqp://in-process.invalid//"
TEMPLATES = ["no such user {}", "KeyError: {}", "order {} of customer {} failed", "timeout after {} s ({})"]
particulars = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(0, 1e6, allow_nan=False).map(lambda value: f"{value:.3f}"),
    st.uuids().map(str),
    st.text(st.characters(blacklist_characters="'\\", blacklist_categories=("Cs",)), max_size=20).map(
        lambda text: f"'{text}'"
    ),
    st.binary(min_size=4, max_size=12).map(lambda raw: "0x" + raw.hex()),
)


@given(
    st.sampled_from(TEMPLATES),
    st.lists(particulars, min_size=2, max_size=2),
    st.lists(particulars, min_size=2, max_size=2),
)
def test_failures_that_differ_only_in_their_particulars_have_one_masked_message(template, one, other):
    assert masked(template.format(*one)) == masked(template.format(*other))


@given(st.text(max_size=2000))
def test_any_message_is_masked_into_a_bounded_line(message):
    assert len(masked(message)) <= 300 and "\n" not in masked(message)


def test_a_stack_is_its_files_and_functions_without_line_numbers():
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "shop/a.py", line 3, in charge\n    x()\n'
        '  File "shop/b.py", line 9, in x\n    raise KeyError\n'
    )
    moved = traceback.replace("line 3", "line 4").replace("line 9", "line 12")
    assert frames(traceback) == frames(moved) == ("shop/a.py:charge", "shop/b.py:x")


def test_a_group_points_at_the_service_s_own_code_and_a_refused_payload_names_its_argument():
    stack = frames(
        "Traceback (most recent call last):\n"
        '  File "/srv/shop/handlers.py", line 3, in on_paid\n    charge()\n'
        '  File "/srv/shop/billing.py", line 9, in charge\n    client.post()\n'
        '  File "/venv/lib/python3.11/site-packages/kombu/connection.py", line 9, in post\n    raise OSError\n'
    )
    assert Cause("shop.on_paid", "OSError", "", stack).origin == "/srv/shop/billing.py:charge"
    app = events_app("shop", broker_url=URL)

    @app.handler("billing.invoice.paid")
    def on_paid(invoice_id: int, amount: str) -> None: ...

    with in_process(app) as events:
        app.fire("billing.invoice.paid", [42], {})  # fired without its amount
        events.drain()
        [archived] = events.archived("shop")
    cause = Failure.of(archived).cause
    assert cause.origin == ""  # refused before the handler ran: no frame of the service's is where it failed
    assert "missing a required argument: amount" in cause.title, cause.title  # the argument, not masked


def test_groups_are_counted_with_their_first_and_last_seen_largest_first():
    now = datetime(2026, 11, 27, tzinfo=timezone.utc)
    key_error = Cause("shop.charge", "KeyError", "<…>", ("shop/a.py:charge",))
    timeout = Cause("shop.charge", "TimeoutError", "after <…> s", ())
    failures = [Failure(key_error, "order.placed", "non_retryable", now + timedelta(minutes=n)) for n in range(3)]
    failures.append(Failure(timeout, "order.paid", "max_retries", None))
    big, small = grouped(failures)
    assert (big.cause, big.count, big.first_seen, big.last_seen) == (key_error, 3, now, now + timedelta(minutes=2))
    assert (small.count, small.first_seen, small.events) == (1, None, ("order.paid",))
    assert big.id != small.id and big.id == Cause("shop.charge", "KeyError", "<…>", ("shop/a.py:charge",)).id
    assert Cause("shop.refund", "KeyError", "<…>", ("shop/a.py:charge",)).id != big.id  # another handler
    assert big.summary()["title"] == "KeyError: <…>"


def test_the_index_reads_an_archive_again_only_when_its_stamp_changed_and_keeps_what_it_read():
    billing = events_app("billing", broker_url=URL)
    orders = events_app("orders", broker_url=URL)

    @orders.handler("billing.invoice.paid", max_retries=0)
    def on_paid(invoice_id: int, who: str):
        if who == "nobody":
            raise PermanentFailure(f"no invoice {invoice_id}")
        raise KeyError(who)

    with in_process(billing, orders) as events:
        for n in range(3):
            billing.fire("billing.invoice.paid", (n, "nobody"))
        billing.fire("billing.invoice.paid", (7, "linus"))
        index = ArchiveIndex(events.transport, keep=3)
        first = index.refresh("orders", stamp=(4, 4, 0))
        assert first.count == 4 and len(first.entries) == 3  # every one counted, the newest kept
        assert [group.count for group in first.groups] == [3, 1]
        assert first.groups[0].cause.message == "no invoice <…>" and "on_paid" in first.tracebacks[first.groups[0].id]
        assert json.loads(first.entries[-1].arguments) == {"[0]": 7, "[1]": "linus"}
        billing.fire("billing.invoice.paid", (8, "ada"))
        assert index.refresh("orders", stamp=(4, 4, 0)) is first  # not read again
        assert index.refresh("orders", stamp=(4, None, None)) is first  # counts the broker has not reported
        second = index.refresh("orders", stamp=(5, 5, 0))
        assert [group.count for group in second.groups] == [3, 2]  # KeyError('ada') is KeyError('linus')'s cause
        assert second.entries[-2] is first.entries[-1]  # read before: not decoded again
        assert len(second.members(second.groups[1].id)) == 2
        # Counted 6 but read 5 (one removed meanwhile, or held by another reader): read again at the next stamp,
        # even an equal one, instead of standing for minutes.
        misread = index.refresh("orders", stamp=(6, 6, 0))
        assert misread.count == 5 and misread.stamp is None
        assert index.refresh("orders", stamp=(6, 6, 0)) is not misread
        index.forget(set())
        assert index.snapshot("orders") is None
    orders.close()
    billing.close()


def queue(name: str, ready: int = 0, consumers: int = 1, acked: float | None = None) -> QueueState:
    return QueueState(name, ready, 0, consumers, None, acked, 3, 3)


def test_a_service_with_a_problem_comes_first_and_its_internal_queues_are_folded():
    partitions = tuple(queue(f"shop.ordered.0{n}", acked=1.0) for n in range(8))
    shop = ServiceQueues("shop", 0, (queue("shop:order.placed", acked=2.0), *partitions))
    quiet = ServiceQueues("alpha", 0, (queue("alpha:order.placed"),))
    stuck = ServiceQueues("zulu", 0, (queue("zulu:order.placed", ready=40, consumers=0),))
    paused = {"w1": {"breakers": {"shop.charge": "open", "shop.refund": "closed"}}}
    rows = by_urgency(
        [service_row(quiet, None, {}, None), service_row(shop, None, paused, 0.5), service_row(stuck, None, {}, None)]
    )
    assert [row.name for row in rows] == ["shop", "zulu", "alpha"]
    assert rows[0].problems == ("failing: 30 archived per minute", "paused: shop.charge")
    assert rows[0].handled_per_minute == 600.0  # the event queue's acks and the partitions'
    assert rows[1].problems == ("40 event(s) waiting and no consumer",) and rows[2].problems == ()
    assert [line.name for line in folded(shop)] == ["shop:order.placed", "ordered partitions (8 queues)"]
    replaying = Cursor("r1", {}, "shop.charge", 1200, replayed=1200)
    assert service_row(quiet, None, {}, None, replaying).history_replay == (
        "history replay r1 into shop.charge: 1,200 replayed, stopped or running, next offset 1200"
    )


def test_archived_per_minute_counts_what_the_archive_took_in_the_last_minute_and_no_stats_are_none_handled():
    now = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
    cause = Cause("shop.charge", "KeyError", "", ())
    entries = tuple(
        Entry(f"e{n}", "order.placed", "shop.charge", "max_retries", "KeyError", "", cause, 3, None, moment, "[]")
        for n, moment in enumerate([now - timedelta(minutes=5)] + [now - timedelta(seconds=n) for n in range(11)])
    )
    snapshot = Snapshot("shop", 12, entries, read_at=now)
    fresh = ServiceQueues("shop", 12, (queue("shop:order.placed"),))  # no message stats yet
    row = service_row(fresh, snapshot, {}, 0.0, now=now)  # the management API's rate: 0.0 after the burst
    assert row.failed_per_minute == 11.0 and row.handled_per_minute == 0.0


def test_the_chart_adds_the_services_up_at_each_sample():
    one = ServiceQueues("a", 0, (), ((0.0, 1.0), (60.0, 4.0)), ((60.0, 10.0),))
    two = ServiceQueues("b", 0, (), ((0.0, 5.0), (60.0, 2.0)), ((60.0, 5.0), (120.0, 1.0)))
    drawn = chart([one, two])
    assert drawn["t"] == [60.0, 120.0]
    assert drawn["series"][0]["values"] == [15.0, 1.0]
    assert drawn["series"][1]["values"] == [3.0, None]  # the archive's growth; a replay's fall counts 0
    # The broker started at 100 s: the samples before are zeros nobody counted, and are not drawn.
    assert chart([one, two], since=100.0)["t"] == [120.0]
    beat = Reading(datetime.fromtimestamp(1000, timezone.utc), (), nodes=({"uptime": 900_000}, {"uptime": 5_000}))
    assert beat.broker_started == 100.0  # its longest-running node's start


def test_the_event_log_is_filtered_newest_first_and_read_back_from_its_file(tmp_path):
    path = tmp_path / "audit.jsonl"
    trail = AuditTrail(path)
    trail.record("ann@console(10.0.0.1)", "replay", "shop", "group 1f2e", ids=["a"])
    trail.record("bob@console(10.0.0.2)", "purge", "shop", "1 message(s)", ids=["b"])
    trail.record("bob@console(10.0.0.2)", "pause", "billing", "handler charge")
    assert [record.action for record in trail.records()] == ["pause", "purge", "replay"]
    assert [record.action for record in trail.records(service="shop", who="BOB")] == ["purge"]
    with path.open("a") as out:
        out.write('{"cut short by a cra')
    again = AuditTrail(path)
    assert [record.target for record in again.records(action="replay")] == ["group 1f2e"]
    assert again.records(action="replay")[0].detail == {"ids": ["a"]}


def test_every_archive_reason_is_explained_in_an_operator_s_words():
    assert set(MEANINGS) == set(Reason) and all(len(meaning) > 20 for meaning in MEANINGS.values())
