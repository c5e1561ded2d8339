"""What the publishers change on a connection, and how they encode a body (no broker needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kombu.exceptions import EncodeError
from kombu.utils.json import dumps as kombu_dumps

from amqp_events.transport.publisher import encoded, read_only_for_confirms
from amqp_events.wire.message import OutgoingMessage


def test_skipping_the_poll_leaves_shared_capabilities_alone():
    """py-amqp copies ``client_properties`` one level deep: capabilities an app gave in its transport options are
    one dict shared by every connection (Celery's own among them)."""
    given = {"connection.blocked": True, "publisher_confirms": True}
    connection = SimpleNamespace(client_properties={"capabilities": given})
    read_only_for_confirms(SimpleNamespace(connection=connection))
    assert connection.client_properties["capabilities"] == {"connection.blocked": False, "publisher_confirms": True}
    assert given == {"connection.blocked": True, "publisher_confirms": True}


class Refuses:
    def __json__(self):
        raise KeyError("no")


@pytest.mark.parametrize(
    "body",
    [[[1, "x"], {"amount": "10.00", "n": 1.5}, {}], {"nested": [{"a": None}], "big": 10**30}, "text", [float("nan")]],
)
def test_a_body_is_encoded_as_kombu_encodes_it(body):
    content_type, encoding, text = encoded(OutgoingMessage("events", "e", {}, body, "id"))
    assert (content_type, encoding, text) == ("application/json", "utf-8", kombu_dumps(body))


def test_what_json_cannot_carry_is_kombus_encode_error():
    for body in ([Refuses()], [{1, 2}]):
        with pytest.raises(EncodeError):
            encoded(OutgoingMessage("events", "e", {}, body, "id"))
