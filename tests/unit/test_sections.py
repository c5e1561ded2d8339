"""``retry``, ``optional`` and ``poisonous`` sections: how they mark failures and what the outcome core
makes of the marks (pure; the real-broker runs are in test_sections_broker.py)."""

from __future__ import annotations

import logging

import pytest
from celery.exceptions import Retry

from amqp_events import PermanentFailure, Reason, optional, poisonous, retry
from amqp_events.core.outcome import Failed, Redeliver, decide
from amqp_events.core.outcome import SendToArchive as Archive
from amqp_events.core.sections import section_of
from amqp_events.wire.message import FAILED_SECTION, SECTION_RETRIES, EventMetadata, copy_headers
from unit.test_outcome import NOW, delivery, handling


def failure_in(section: object, error: Exception) -> Exception:
    try:
        with section:  # type: ignore[attr-defined]
            raise error
    except Exception as exc:
        return exc
    raise AssertionError("the section swallowed the failure")


def test_a_section_is_named_after_where_it_is_unless_named():
    error = failure_in(retry(), ValueError("x"))
    section = section_of(error)
    assert section is not None and section.kind == "retry"
    where, line = section.name.rsplit(":", 1)
    assert where.endswith("test_sections.test_a_section_is_named_after_where_it_is_unless_named") and line.isdigit()
    assert section_of(failure_in(poisonous(name="parse"), KeyError("x"))).name == "parse"  # type: ignore[union-attr]


def test_the_innermost_matching_section_claims_a_failure_and_others_let_it_pass():
    def handler() -> None:
        with retry(name="outer"), retry(on=(ConnectionError,), name="network"), poisonous(name="parse"):
            raise ConnectionError("down")

    with pytest.raises(ConnectionError) as raised:
        handler()
    assert section_of(raised.value).name == "parse"  # type: ignore[union-attr]

    error = failure_in(retry(name="outer"), failure_in(retry(on=(ConnectionError,), name="network"), KeyError("k")))
    assert section_of(error).name == "outer"  # type: ignore[union-attr]  # not a ConnectionError: not "network"


def in_a_celery_handler():
    """What a handler run by a Celery worker runs in: the pipeline's record of it, with Celery's control flow."""
    from amqp_events.celery.task import CONTROL_FLOW
    from amqp_events.core.delivery import Delivery, Running, handler_running

    return handler_running(Running(Delivery({}, "q"), "orders", "h", CONTROL_FLOW, print, print))


def test_optional_swallows_its_failures_only_and_never_celery_control_flow(caplog):
    with caplog.at_level(logging.WARNING, "amqp_events.sections"), optional(ConnectionError, name="notify"):
        raise ConnectionError("smtp down")
    assert "optional section notify failed, going on: ConnectionError(smtp down)" in caplog.text
    with pytest.raises(KeyError), optional(ConnectionError):
        raise KeyError("not optional")
    with in_a_celery_handler(), pytest.raises(Retry), optional():
        raise Retry()
    with pytest.raises(ValueError), optional(), poisonous(name="inner"):  # claimed inside: not optional
        raise ValueError("bad data")


def test_a_poisonous_failure_is_archived_at_once_with_its_section():
    error = failure_in(poisonous(name="parse"), KeyError("amount"))
    outcome = decide(delivery(retries=0), Failed(error), handling(max_retries=5), NOW)
    assert isinstance(outcome, Archive) and outcome.reason == Reason.POISONOUS and outcome.attempts == 1
    assert outcome.copy.headers["archive_section"] == "parse"
    assert outcome.copy.headers["archive_reason"] == "poisonous"


def test_a_retry_section_counts_its_own_retries_in_the_message():
    handling_ = handling(max_retries=1)
    error = failure_in(retry(max_retries=3, backoff_base=10, name="capture"), ConnectionError("down"))
    headers: dict[str, object] = {}
    delays = []
    for retries in range(3):
        outcome = decide(delivery(retries, **headers), Failed(error), handling_, NOW)
        assert isinstance(outcome, Redeliver)
        headers = {key: outcome.copy.headers[key] for key in (SECTION_RETRIES, FAILED_SECTION)}
        delays.append(outcome.delay)
    assert headers == {SECTION_RETRIES: {"capture": 3}, FAILED_SECTION: "capture"}
    assert delays == [10, 20, 40]  # the section's own backoff
    outcome = decide(delivery(3, **headers), Failed(error), handling_, NOW)
    assert isinstance(outcome, Archive) and outcome.reason == Reason.MAX_RETRIES and outcome.attempts == 4
    assert outcome.copy.headers["archive_section"] == "capture"


def test_the_handlers_own_policy_counts_only_the_retries_no_section_claimed():
    claimed = {SECTION_RETRIES: {"capture": 3}, FAILED_SECTION: "capture"}
    outcome = decide(delivery(3, **claimed), Failed(ValueError("plain")), handling(max_retries=1), NOW)
    assert isinstance(outcome, Redeliver) and outcome.delay == 1  # its first retry: backoff from zero
    assert FAILED_SECTION not in outcome.copy.headers
    assert outcome.copy.headers[SECTION_RETRIES] == {"capture": 3}
    outcome = decide(delivery(4, **{SECTION_RETRIES: {"capture": 3}}), Failed(ValueError("x")), handling(1), NOW)
    assert isinstance(outcome, Archive) and outcome.reason == Reason.MAX_RETRIES
    assert outcome.copy.headers["archive_section"] == ""


def test_a_permanent_failure_inside_a_retry_section_is_still_not_retried():
    error = failure_in(retry(max_retries=10, name="capture"), PermanentFailure("card refused"))
    outcome = decide(delivery(), Failed(error), handling(), NOW)
    assert isinstance(outcome, Archive) and outcome.reason == Reason.NON_RETRYABLE


def test_current_event_says_which_section_failed_and_a_replay_starts_the_counts_over():
    headers = {"task": "e", "id": "1", "retries": 2, SECTION_RETRIES: {"capture": 2}, FAILED_SECTION: "capture"}
    assert EventMetadata.from_headers(headers).failed_section == "capture"
    assert EventMetadata.from_headers({"task": "e", "id": "1"}).failed_section is None
    replayed = copy_headers(headers, retries=0)
    assert SECTION_RETRIES not in replayed and FAILED_SECTION not in replayed


def test_an_optional_failure_is_logged_with_the_event_id_and_counted(caplog):
    from prometheus_client import REGISTRY

    from amqp_events import events_app
    from amqp_events.testing.in_process import in_process

    app = events_app("billing", broker_url="amqp://in-process.invalid//")
    done = []

    @app.handler("billing.invoice.paid")
    def on_paid(invoice_id: int) -> None:
        with optional(ConnectionError, name="notify-accounting"):
            raise ConnectionError("accounting is down")
        done.append(invoice_id)

    handler = f"{on_paid.__module__}.{on_paid.__qualname__}"
    labels = {"service": "billing", "handler": handler, "section": "notify-accounting"}
    before = REGISTRY.get_sample_value("amqp_events_optional_failures_total", labels) or 0
    with caplog.at_level(logging.WARNING, "amqp_events.sections"), in_process(app) as events:
        event_id = app.fire("billing.invoice.paid", [42])
        assert done == [42] and events.archived("billing") == []
    assert f"event_id={event_id} service=billing handler={handler}" in caplog.text
    assert REGISTRY.get_sample_value("amqp_events_optional_failures_total", labels) == before + 1
    app.close()
