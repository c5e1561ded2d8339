"""The in-process mode under pytest-asyncio: a test that is itself a coroutine fires with ``await`` and its
services' coroutine handlers run on the mode's virtual clock (as they do from a plain test, test_in_process.py)."""

from __future__ import annotations

import asyncio

import pytest

from amqp_events import current_event, events_app
from amqp_events.testing.in_process import in_process


@pytest.mark.asyncio
async def test_a_coroutine_test_fires_and_its_coroutine_handlers_retry_on_the_virtual_clock():
    billing = events_app("billing", broker_url="amqp://in-process.invalid//")
    shipping = events_app("shipping", broker_url="amqp://in-process.invalid//", amqp_events_max_retries=2)
    runs: list[tuple[int, int, float]] = []

    @billing.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int, amount: str):
        if not amount:
            raise ValueError("amount required")

    @shipping.handler("billing.invoice.paid")
    async def book_courier(invoice_id: int, amount: str):
        await asyncio.sleep(0)
        event = current_event()
        runs.append((invoice_id, event.attempt, events.clock.now().timestamp()))
        if event.attempt == 1:
            raise ConnectionError("the courier's API is down")

    with in_process(billing, shipping) as events:
        await invoice_paid.fire_async(7, "10.00")  # handled while this test's loop waits
        with pytest.raises(ValueError, match="amount required"):
            await invoice_paid.fire_async(8, "")
        assert [(n, attempt) for n, attempt, _ in runs] == [(7, 1)]
        events.drain()  # the retry's delay passes on the virtual clock, not the wall's
        assert [(n, attempt) for n, attempt, _ in runs] == [(7, 1), (7, 2)]
        assert runs[1][2] - runs[0][2] == 1.0  # the first backoff, exactly
    billing.close()
    shipping.close()
