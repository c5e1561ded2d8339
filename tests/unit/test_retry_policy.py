"""Backoff maths and retry decisions: pure, no broker."""

from __future__ import annotations

import pytest

from amqp_events import PermanentFailure, Reason, RetryPolicy
from amqp_events.core.policy import GiveUp, RetryLater
from amqp_events.settings import Settings


def test_exponential_backoff_from_one_second_doubling_and_capped():
    policy = RetryPolicy(max_retries=20, backoff_base=1, backoff_max=60)
    assert [policy.backoff(retries) for retries in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_backoff_rounds_up_and_is_at_least_a_second():
    policy = RetryPolicy(max_retries=5, backoff_base=0.3, backoff_max=100)
    assert [policy.backoff(retries) for retries in range(4)] == [1, 1, 2, 3]


def test_jitter_stays_between_half_and_the_whole_delay():
    policy = RetryPolicy(max_retries=5, backoff_base=8, backoff_max=100, jitter=True)
    assert policy.backoff(0, rng=lambda: 0.0) == 4
    assert policy.backoff(0, rng=lambda: 0.999) == 8


def test_huge_retry_counts_do_not_overflow():
    assert RetryPolicy(max_retries=10_000, backoff_max=3600).backoff(5000) == 3600


@pytest.mark.parametrize(
    ("retries", "expected"),
    [(0, RetryLater(1)), (1, RetryLater(2)), (2, RetryLater(4)), (3, GiveUp(Reason.MAX_RETRIES))],
)
def test_decisions_up_to_max_retries(retries, expected):
    assert RetryPolicy(max_retries=3).decide(ValueError(), retries) == expected


def test_max_retries_zero_archives_the_first_failure():
    assert RetryPolicy(max_retries=0).decide(ValueError(), 0) == GiveUp(Reason.MAX_RETRIES)


def test_non_retryable_exceptions_and_permanent_failure_give_up_at_once():
    policy = RetryPolicy(max_retries=5, dont_retry=(KeyError,))
    assert policy.decide(KeyError("x"), 0) == GiveUp(Reason.NON_RETRYABLE)
    assert policy.decide(PermanentFailure("x"), 0) == GiveUp(Reason.NON_RETRYABLE)
    assert policy.decide(LookupError("x"), 0) == RetryLater(1)


def test_an_explicit_countdown_and_max_retries_apply_to_one_decision_only():
    policy = RetryPolicy(max_retries=3)
    assert policy.decide(ValueError(), 0, countdown=4.2) == RetryLater(5)
    assert policy.decide(ValueError(), 3, max_retries=5) == RetryLater(8)
    assert policy.max_retries == 3  # nothing stored: no drift


def test_handler_options_override_app_settings():
    settings = Settings(max_retries=7, backoff_base=2, backoff_max=100, backoff_jitter=True)
    assert RetryPolicy.from_settings(settings) == RetryPolicy(7, 2, 100, True, ())
    assert RetryPolicy.from_settings(settings, max_retries=1, jitter=False).max_retries == 1
