"""Event versions and upcasters, in the in-process mode (the same router and pipeline as a worker): a version-1
event reaches a version-2 handler upcast, live and through its retries; firing stays at the declared version."""

from __future__ import annotations

from typing import Any

import pytest

from amqp_events import events_app
from amqp_events.testing.in_process import in_process
from amqp_events.wire.message import EVENT_VERSION, Reason

EVENT = "billing.invoice.paid"


def v1_to_v2(arguments: dict[str, Any]) -> dict[str, Any]:
    """Version 2 calls the amount ``total`` and says its currency."""
    return {"invoice_id": arguments["invoice_id"], "total": arguments.pop("amount"), "currency": "EUR"}


def producer(version: int, wire_format: str = "celery"):
    app = events_app("billing", broker_url="amqp://guest:guest@localhost:5672/", amqp_events_wire_format=wire_format)
    if version == 1:

        @app.event(EVENT)
        def paid(invoice_id: int, amount: str) -> None: ...

    else:

        @app.event(EVENT, version=2)
        def paid(invoice_id: int, total: str, currency: str) -> None: ...

    return app, paid


def consumer(runs: list[dict[str, Any]], fail_first: int = 0):
    app = events_app("shipping", broker_url="amqp://guest:guest@localhost:5672/", amqp_events_max_retries=3)

    @app.handler(EVENT, upcasters={1: v1_to_v2})
    def on_paid(invoice_id: int, total: str, currency: str) -> None:
        runs.append({"invoice_id": invoice_id, "total": total, "currency": currency})
        if len(runs) <= fail_first:
            raise RuntimeError("not yet")

    return app


@pytest.mark.parametrize("wire_format", ["celery", "cloudevents"])
@pytest.mark.parametrize("fired_at", [1, 2])
def test_a_version_2_handler_takes_events_of_either_version_in_either_format(fired_at, wire_format):
    runs: list[dict[str, Any]] = []
    billing, paid = producer(fired_at, wire_format)
    shipping = consumer(runs)
    with in_process(billing, shipping) as events:
        paid(42, "10.00") if fired_at == 1 else paid(42, "10.00", "EUR")
        events.drain()
    assert runs == [{"invoice_id": 42, "total": "10.00", "currency": "EUR"}]
    headers = billing.event_message(EVENT, [], {"invoice_id": 42}).headers
    version = headers.get(EVENT_VERSION, headers.get("ce-eventversion"))
    assert version == (None if fired_at == 1 else "2" if wire_format == "cloudevents" else 2)  # 1 says nothing


def test_a_retried_event_is_upcast_at_each_attempt_its_copies_as_it_was_fired():
    runs: list[dict[str, Any]] = []
    billing, paid = producer(1)
    shipping = consumer(runs, fail_first=2)
    with in_process(billing, shipping) as events:
        paid(7, "3.50")
        events.drain()
    assert runs == [{"invoice_id": 7, "total": "3.50", "currency": "EUR"}] * 3


def test_an_upcaster_that_fails_archives_the_event_saying_which_step():
    billing, paid = producer(1)
    shipping = events_app("shipping", broker_url="amqp://guest:guest@localhost:5672/")

    @shipping.handler(EVENT, upcasters={1: lambda arguments: arguments["missing"]})
    def on_paid(invoice_id: int, total: str, currency: str) -> None: ...

    with in_process(billing, shipping) as events:
        paid(1, "1.00")
        events.drain()
        [archived] = events.archived("shipping")
    assert archived.reason == Reason.BAD_ARGUMENTS
    assert archived.exception_message.startswith("upcasting from version 1 to 2 failed: KeyError(")


@pytest.mark.parametrize(
    "upcasters, complaint",
    [({}, "a dict from versions"), ({0: v1_to_v2}, "whole numbers from 1"), ({1: v1_to_v2, 3: v1_to_v2}, "follow"),
     ({1: "v1_to_v2"}, "a function")],
)  # fmt: skip
def test_upcasters_that_cannot_be_are_refused_when_the_handler_is_registered(upcasters, complaint):
    app = events_app("shipping", broker_url="amqp://guest:guest@localhost:5672/")
    with pytest.raises(TypeError, match=complaint):
        app.handler(EVENT, upcasters=upcasters)(lambda invoice_id, total, currency: None)


@pytest.mark.parametrize("version", [0, -1, True, "2"])
def test_an_event_s_version_is_a_whole_number_from_1(version):
    app = events_app("billing", broker_url="amqp://guest:guest@localhost:5672/")
    with pytest.raises(ValueError, match="version must be a whole number from 1"):
        app.event(EVENT, version=version)


def test_a_handler_of_version_1_takes_a_version_2_event_without_what_it_has_no_parameter_for():
    runs: list[dict[str, Any]] = []
    billing = events_app("billing", broker_url="amqp://guest:guest@localhost:5672/")

    @billing.event(EVENT, version=2)
    def paid(invoice_id: int, amount: str, currency: str) -> None: ...

    shipping = events_app("shipping", broker_url="amqp://guest:guest@localhost:5672/")

    @shipping.handler(EVENT)
    def on_paid(invoice_id: int, amount: str) -> None:
        runs.append({"invoice_id": invoice_id, "amount": amount})

    with in_process(billing, shipping) as events:
        paid(5, "9.00", "CHF")  # a producer that moved first: the currency is left out, nothing is archived
        billing.fire(EVENT, [], {"invoice_id": 6, "currency": "CHF"}, event_id=None)  # the amount is still required
        events.drain()
        [archived] = events.archived("shipping")
    assert runs == [{"invoice_id": 5, "amount": "9.00"}]
    assert archived.reason == Reason.BAD_ARGUMENTS and "amount" in archived.exception_message
