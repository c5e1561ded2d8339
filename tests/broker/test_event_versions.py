"""Event versions on a real broker and in the in-process mode alike: events fired at version 1 (``amount``) reach a
handler of version 2 (``total``, ``currency``) through its upcaster, live, from the archive and from the history."""

from __future__ import annotations

import pytest
from contract_modes import archived_in
from helpers import wait_archived

from amqp_events import Reason
from amqp_events.console.fleet import Fleet
from amqp_events.errors import BadArguments
from amqp_events.history import Query

EVENT = "billing.invoice.paid"
MODES = pytest.mark.parametrize("mode", ["in_process", "broker"], indirect=True)


def upcast(invoice_id: int) -> dict:
    return {"invoice_id": invoice_id, "total": f"{invoice_id}.00", "currency": "EUR"}


@MODES
def test_version_1_events_reach_the_version_2_handler_upcast(mode, records):
    mode.start("invoices")
    for n in (1, 2):
        mode.producer.fire(EVENT, [], {"invoice_id": n, "amount": f"{n}.00"})  # no event_version: version 1
    mode.until(lambda: len(records.all(service="invoices")) == 2)
    ran = sorted(records.all(service="invoices"), key=lambda run: run["invoice_id"])
    assert [{key: run[key] for key in ("invoice_id", "total", "currency")} for run in ran] == [upcast(1), upcast(2)]
    assert mode.archive("invoices").list() == []


@MODES
def test_an_archived_version_1_event_is_upcast_when_replayed_after_the_fix(mode, records):
    mode.start("invoices", env={"BROKEN_UPCASTER": "1"})
    event_id = mode.producer.fire(EVENT, [], {"invoice_id": 7, "amount": "7.00"})
    [entry] = archived_in(mode, "invoices", 1)
    assert entry.id == event_id and entry.reason == Reason.BAD_ARGUMENTS
    assert "upcasting from version 1 to 2 failed: LookupError" in entry.exception_message
    assert entry.arguments == ([], {"invoice_id": 7, "amount": "7.00"})  # kept as it was fired
    mode.deploy_fix("invoices")
    assert mode.archive("invoices").replay().replayed == [event_id]
    mode.until(lambda: records.all(service="invoices", id=event_id))
    [run] = records.all(service="invoices", id=event_id)
    assert {key: run[key] for key in ("invoice_id", "total", "currency")} == upcast(7)


@MODES
def test_version_1_events_replayed_from_the_history_are_upcast(mode, records):
    mode.start("invoices", env={"HISTORY": "1"})
    invoices = mode.module("invoices").app
    since = invoices.context.clock.now()
    ids = [mode.producer.fire(EVENT, [], {"invoice_id": n, "amount": f"{n}.00"}) for n in (3, 4)]
    mode.until(lambda: len(records.all(service="invoices")) == 2)
    report = invoices.history().replay(Query(since=since, events=EVENT), handler="on_paid").run()
    assert report.replayed == 2
    mode.until(lambda: len(records.all(service="invoices")) == 4)
    for event_id, n in zip(ids, (3, 4), strict=True):
        runs = records.all(service="invoices", id=event_id)
        assert [{key: run[key] for key in ("invoice_id", "total", "currency")} for run in runs] == [upcast(n)] * 2


def test_contracts_check_against_the_archive_and_the_history_counts_what_today_s_handler_would_refuse(
    worker, producer, cli_process
):
    worker("invoices", env={"HISTORY": "1", "BROKEN_UPCASTER": "1"})
    for n in (1, 2):
        producer.fire(EVENT, [], {"invoice_id": n, "amount": f"{n}.00"})
    wait_archived(producer.archive("invoices"), 2)
    command = ("contracts", "check", "--against", "archive", "--against", "history", "--since", "1h")
    fixed = cli_process(*command, app="services.invoices", env={"HISTORY": "1", "FIXED": "1"})
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    for place in ("archive", "history"):
        assert f"| {place} | {EVENT} | {EVENT} | 2 | 0 |" in fixed.stdout, fixed.stdout
    forgot = cli_process(*command, app="services.invoices", env={"HISTORY": "1", "NO_UPCASTER": "1"})
    assert forgot.returncode == 1, forgot.stdout + forgot.stderr
    for place in ("archive", "history"):
        assert f"| {place} | {EVENT} | {EVENT} | 2 | 2 | 2: " in forgot.stdout, forgot.stdout
    assert "cannot take this payload" in forgot.stdout


SETTLED = "billing.invoice.settled"


@MODES
@pytest.mark.parametrize("first", ["consumer", "producer"])
def test_an_added_argument_ships_in_either_order_without_an_archived_event(mode, records, first):
    """Version 2 of ``billing.invoice.settled`` adds a currency: whichever side moves first, every event runs."""
    mode.start("receipts", env={"RECEIPTS_VERSION": "2" if first == "consumer" else "1"})
    if first == "consumer":  # today's producer, version 1: the upcaster gives it its currency
        mode.producer.fire(SETTLED, [], {"invoice_id": 1, "amount": "1.00"})
        expected = {"invoice_id": 1, "amount": "1.00", "currency": "EUR"}
    else:  # the producer's version 2 to today's handler: it leaves out the currency it has no parameter for
        settled = mode.producer.event(SETTLED, version=2)(settled_v2)
        settled(1, "1.00", "CHF")
        expected = {"invoice_id": 1, "amount": "1.00", "currency": None}
    mode.until(lambda: records.all(service="receipts"))
    [run] = records.all(service="receipts")
    assert {key: run[key] for key in expected} == expected  # it ran once, to its end: nothing was archived
    assert mode.archive("receipts").list() == []


def settled_v2(invoice_id: int, amount: str, currency: str) -> None:
    """Version 2 of the event, as its producer declares it."""


def test_the_console_edits_an_archived_version_1_event_as_its_handler_takes_it(
    worker, producer, service_app, rabbitmq, vhost, records, monkeypatch
):
    """Edit and retry in the console with the service's app: the edited arguments are checked as the worker will
    hand them to the handler (a version-1 body through its upcaster), and the replay runs upcast."""
    broken = worker("invoices", env={"BROKEN_UPCASTER": "1"})
    event_id = producer.fire(EVENT, [], {"invoice_id": 7, "amount": "7.00"})
    wait_archived(producer.archive("invoices"), 1)
    broken.stop()
    monkeypatch.setenv("FIXED", "1")  # the app the console loads is the fixed release
    worker("invoices", env={"FIXED": "1"})
    fleet = Fleet(service_app("invoices"), rabbitmq.management, vhost, own=True)
    with pytest.raises(BadArguments, match="upcasting from version 1 to 2 failed: KeyError"):
        fleet.retry_edited("invoices", event_id, [], {"invoice_id": 7, "total": "8.00", "currency": "EUR"}, "op")
    assert fleet.retry_edited("invoices", event_id, [], {"invoice_id": 7, "amount": "8.00"}, "op")
    [run] = records.wait(1, service="invoices")
    assert {key: run[key] for key in ("invoice_id", "total", "currency")} == {
        "invoice_id": 7,
        "total": "8.00",
        "currency": "EUR",
    }
