"""Which services an event reaches, as the console reads it from the management API's bindings. Pure."""

from __future__ import annotations

from amqp_events.console.discovery import subscribers


def test_an_event_reaches_the_services_whose_queues_or_ordered_exchanges_the_events_exchange_routes_it_to():
    bindings = [
        {"source": "events", "destination": "orders:billing.invoice.paid", "routing_key": "billing.invoice.paid"},
        {"source": "events", "destination": "shipping.events", "routing_key": "billing.invoice.paid"},
        {"source": "events", "destination": "ledger.ordered", "routing_key": "billing.invoice.paid"},
        {"source": "events", "destination": "amqp_events.history", "routing_key": "#"},  # no one's
        {"source": "amqp_events.delivery", "destination": "orders:test.ping", "routing_key": "x"},  # not an event's
        {"source": "events", "destination": "orders:test.ping", "routing_key": "test.ping"},
    ]
    assert subscribers(bindings, "events") == {
        "billing.invoice.paid": ["ledger", "orders", "shipping"],
        "test.ping": ["orders"],
    }
