"""The console's pure parts: who may do what, the services found in a queue listing."""

from __future__ import annotations

import base64
import re

import pytest

from amqp_events.console.discovery import services_in
from amqp_events.console.security import (
    Access,
    csrf_matches,
    hash_password,
    is_loopback,
    password_matches,
    refuses_to_start,
)

ANN = hash_password("ann-secret", rounds=1000)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_a_password_hash_matches_its_password_only():
    assert password_matches("ann-secret", ANN) and not password_matches("ann-secreT", ANN)
    assert ANN.startswith("pbkdf2_sha256$1000$") and hash_password("ann-secret", rounds=1000) != ANN  # salted
    assert not password_matches("x", "not a hash")


def test_users_and_tokens_come_from_the_environment_and_a_malformed_entry_is_an_error():
    access = Access.from_environment(
        {"AMQP_EVENTS_CONSOLE_USERS": f"ann:read:{ANN}", "AMQP_EVENTS_CONSOLE_TOKEN": "op-token"}
    )
    assert access.who(basic("ann", "ann-secret"), loopback=False).role == "read"
    assert access.who(basic("ann", "wrong"), loopback=True) is None  # credentials configured: loopback too
    assert access.who(basic("nobody", "ann-secret"), loopback=False) is None
    assert access.who("Bearer op-token", loopback=False).may_change
    assert access.who("Bearer other", loopback=False) is None and access.who(None, loopback=False) is None
    assert access.who("Basic !!!not base64", loopback=False) is None
    with pytest.raises(ValueError, match="is not name:role:hash"):
        Access.from_environment({"AMQP_EVENTS_CONSOLE_USERS": "ann:admin:pbkdf2_sha256$1$a$b"})
    with pytest.raises(ValueError, match="is not name:role:hash"):
        Access.from_environment({"AMQP_EVENTS_CONSOLE_USERS": "ann:read:plain-password"})


def test_without_credentials_only_loopback_is_let_in_and_the_console_only_listens_there():
    nobody = Access()
    assert nobody.who(None, loopback=True).may_change and nobody.who(None, loopback=False) is None
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.2"):
        assert is_loopback(host) and refuses_to_start(host, nobody) is None
    for host in ("0.0.0.0", "10.1.2.3", "::", "console.example"):
        assert "without authentication" in refuses_to_start(host, nobody)
    assert refuses_to_start("0.0.0.0", Access(tokens={"t": "read"})) is None


def test_the_csrf_token_must_be_sent_back_as_it_was_set():
    assert csrf_matches("abc", "abc")
    assert not csrf_matches("abc", "abd") and not csrf_matches(None, "abc") and not csrf_matches("", "")


def test_services_are_found_by_their_archive_and_take_their_own_queues():
    listing = [
        {"name": "orders.archive", "messages": 3, "messages_details": {"samples": [
            {"sample": 3, "timestamp": 1_700_000_120_000}, {"sample": 1, "timestamp": 1_700_000_060_000}]}},
        {"name": "orders:billing.paid", "messages_ready": 2, "messages_unacknowledged": 1, "consumers": 2,
         "members": ["a", "b", "c"], "online": ["a", "b"], "message_stats": {
             "publish_details": {"rate": 4.0}, "ack_details": {"rate": 3.5, "samples": [
                 {"sample": 170, "timestamp": 1_700_000_120_000}, {"sample": 100, "timestamp": 1_700_000_060_000}]}}},
        {"name": "orders.ordered.00", "consumers": 1},
        {"name": "orders-eu:billing.paid"},
        {"name": "shipping.archive"},
        {"name": "odd.name.archive"},  # not a service's name: no service
        {"name": "amqp_events.history"},
    ]  # fmt: skip
    orders, shipping = services_in(listing)
    assert (orders.name, orders.archived, shipping.name, shipping.archived) == ("orders", 3, "shipping", 0)
    assert [queue.name for queue in orders.queues] == ["orders.ordered.00", "orders:billing.paid"]
    paid = orders.queues[1]
    assert (paid.ready, paid.unacked, paid.consumers, paid.incoming, paid.acked) == (2, 1, 2, 4.0, 3.5)
    assert (paid.replicas, paid.online) == (3, 2) and orders.consumers == 2
    assert orders.archived_over_time == ((1_700_000_060.0, 1.0), (1_700_000_120.0, 3.0))
    assert orders.handled_over_time == ((1_700_000_120.0, 70.0),)  # per interval, not the running count


def test_logins_are_counted_per_client_within_a_window_from_when_they_are_sent():
    from amqp_events.console.security import LoginThrottle

    now = [0.0]
    throttle = LoginThrottle(limit=3, window=60, clock=lambda: now[0])
    right = throttle.attempt("10.0.0.1")
    assert right is not None
    throttle.succeeded("10.0.0.1", right)  # a right password does not count
    # Sent at once: each counts as failed while it is checked, so the fourth is refused before any answer.
    in_flight = [throttle.attempt("10.0.0.1") for _ in range(4)]
    assert None not in in_flight[:3] and in_flight[3] is None
    assert throttle.attempt("10.0.0.2") is not None  # another client
    throttle.succeeded("10.0.0.1", in_flight[0])  # one of them was right after all
    assert throttle.attempt("10.0.0.1") is not None and throttle.attempt("10.0.0.1") is None
    now[0] = 61.0
    assert throttle.attempt("10.0.0.1") is not None


def test_an_id_in_a_url_is_one_segment_that_no_browser_resolves():
    from urllib.parse import unquote, urljoin

    from amqp_events.console.urls import segment

    for hostile in ("../../billing/archive/victim-1", "a/b", "?x#y", "100%", "..%2F..", "...", "é/\\\\"):
        quoted = segment(hostile)  # nothing a browser reads as a separator, a dot segment or an escape but its own
        assert re.fullmatch(r"([A-Za-z0-9_~-]|%[0-9A-F]{2})+", quoted) and unquote(quoted) == hostile
        base = "http://console/api/services/orders/archive/"
        assert urljoin(base, quoted + "/retry") == f"{base}{quoted}/retry"
    # Beyond quoting: a browser reads "%2E" and "%2E%2E" as dot segments too (see segment()).
    assert (segment("."), segment("..")) == ("%2E", "%2E%2E")


def test_an_unknown_user_costs_one_password_check_as_a_known_one_does(monkeypatch):
    import hashlib

    from amqp_events.console import security

    users = f"ann:read:{hash_password('secret', rounds=1000)}"
    access = Access.from_environment({"AMQP_EVENTS_CONSOLE_USERS": users})
    rounds = []
    real = hashlib.pbkdf2_hmac
    monkeypatch.setattr(security.hashlib, "pbkdf2_hmac", lambda *a: rounds.append(a[3]) or real(*a[:3], 1))
    for name in ("ann", "nobody"):
        assert access.who("Basic " + base64.b64encode(f"{name}:guess".encode()).decode(), loopback=True) is None
    assert len(rounds) == 2 and rounds[1] == security.ROUNDS


def test_the_console_answers_only_the_names_it_is_reached_by():
    from amqp_events.console.security import allowed_hosts

    assert set(allowed_hosts("127.0.0.1")) >= {"127.0.0.1", "localhost"}
    assert "evil.example" not in allowed_hosts("127.0.0.1")
    assert allowed_hosts("10.1.2.3", ["console.internal"]) == ["10.1.2.3", "console.internal"]
    assert allowed_hosts("0.0.0.0") == ["*"] and allowed_hosts("0.0.0.0", ["ops"]) == ["ops"]


def test_a_message_s_details_stay_small_whatever_it_carries():
    import json

    from amqp_events.console.api import SHOWN_BODY, detail
    from amqp_events.wire.archive_entries import ArchivedMessage
    from amqp_events.wire.message import StoredMessage

    body = json.dumps([["x" * 50_000_000], {}, None]).encode()
    headers = {"task": "test.ping", "id": "big", "archive_reason": "too_large", "note": "n" * 100_000}
    shown = detail(ArchivedMessage.of(StoredMessage(headers, body, "application/json", "utf-8")))
    assert len(json.dumps(shown)) < 20_000
    assert shown["arguments"] is None and str(len(body)) in shown["not_shown"] and shown["body_bytes"] == len(body)
    small = detail(ArchivedMessage.of(StoredMessage(headers, b'[["x"], {}, null]', "application/json", "utf-8")))
    assert small["arguments"] == {"[0]": "x"} and small["not_shown"] is None and SHOWN_BODY > 16
