"""The management API client's credentials: never the AMQP URL's, unless given for it (no broker)."""

from __future__ import annotations

from base64 import b64decode

from amqp_events.transport.management import ManagementAPI


def credentials(api: ManagementAPI) -> str:
    return b64decode(api._authorization.removeprefix("Basic ")).decode()


def test_the_amqp_url_s_credentials_are_never_sent_to_the_management_api(monkeypatch):
    monkeypatch.delenv("AMQP_EVENTS_MANAGEMENT_USER", raising=False)
    monkeypatch.delenv("AMQP_EVENTS_MANAGEMENT_PASSWORD", raising=False)
    api = ManagementAPI.for_amqp_url("amqp://orders:s3cret@broker.example:5672/shop")
    assert api.base_url == "http://broker.example:15672" and "s3cret" not in credentials(api)
    monkeypatch.setenv("AMQP_EVENTS_MANAGEMENT_USER", "monitor")
    monkeypatch.setenv("AMQP_EVENTS_MANAGEMENT_PASSWORD", "m0n")
    assert credentials(ManagementAPI.for_amqp_url("amqp://orders:s3cret@broker.example/")) == "monitor:m0n"


def test_a_management_url_may_carry_its_own_user_which_is_not_left_in_the_url():
    api = ManagementAPI("https://ops:p%40ss@broker.example:15671/")
    assert api.base_url == "https://broker.example:15671" and credentials(api) == "ops:p@ss"
