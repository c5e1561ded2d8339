"""Class-style events: dataclasses and pydantic models round trip through the broker."""

from __future__ import annotations

import uuid

import pytest
from services import catalog

pytestmark = pytest.mark.broker


def test_dataclass_event_round_trip(worker, producer, records):
    worker("orders")
    UserRegistered = producer.event("users.registered")(catalog.UserRegistered)
    event_id = UserRegistered(user_id=7, email="a@example.com").fire()
    [record] = records.wait(1)
    assert record == {
        **record,
        "id": event_id,
        "tag": "user-7",
        "email": "a@example.com",
        "type": "UserRegistered",
    }


def test_pydantic_event_round_trip_with_validation(worker, producer, records):
    worker("orders")
    Model = producer.event("users.registered_model")(catalog.UserRegisteredModel)
    user_id = uuid.uuid4()
    with pytest.raises(ValueError):
        Model(user_id="not-a-uuid", email="x")  # constructing is validating: nothing published
    Model(user_id=user_id, email="b@example.com").fire()
    [record] = records.wait(1)
    assert record["tag"] == f"user-{user_id}" and record["type"] == "UserRegisteredModel"


def test_event_on_a_plain_class_is_refused(producer):
    with pytest.raises(TypeError, match="dataclass or a pydantic model"):

        @producer.event("x.y")
        class NotAnEvent:
            pass
