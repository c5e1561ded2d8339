"""A test module of 100 tests of the ``invoices`` services in the in-process mode (``python -m bench`` runs it)."""

import pytest
from invoices import billing, invoice_paid, shipping

from amqp_events.testing import in_process


@pytest.mark.parametrize("n", range(100))
def test_two_invoices_are_shipped_and_one_is_archived_after_its_retries(n):
    with in_process(billing, shipping) as events:
        for invoice_id in range(3 * n, 3 * n + 3):
            invoice_paid(invoice_id, "10.00")
        events.drain()
        assert sorted(run.kwargs["invoice_id"] for run in events.handled("shipping")) == [3 * n + 1, 3 * n + 2]
        [archived] = events.archived("shipping")
        assert (archived.reason, archived.attempts) == ("max_retries", 3)
