"""Class-style events: dataclasses and pydantic models round trip through the broker."""

from __future__ import annotations

import uuid

import pytest
from services import catalog

from amqp_events import events_app


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


def test_each_app_fires_its_own_event_made_of_one_shared_class(worker, producer, broker_url, records):
    worker("orders")
    other = events_app("accounts", broker_url=broker_url)
    Mine = producer.event("users.registered")(catalog.UserRegistered)
    Theirs = other.event("users.registered")(catalog.UserRegistered)
    mine, theirs = Mine(user_id=1, email="a@example.com").fire(), Theirs(user_id=2, email="b@example.com").fire()
    assert records.wait(1, tag="user-1")[0]["id"] == mine
    assert records.wait(1, tag="user-2")[0]["id"] == theirs
    other.close()


@pytest.mark.parametrize("shared", [catalog.UserRegistered, catalog.UserRegisteredModel])
def test_making_an_event_of_a_class_leaves_the_class_as_it_was(shared):
    first, second = events_app("billing"), events_app("accounts")
    One = first.event("users.registered")(shared)
    Two = second.event("users.registered")(shared)
    assert not hasattr(shared, "fire") and not hasattr(shared, "event_name")
    assert (One.event_app, Two.event_app) == (first, second) and One is not Two
    assert issubclass(One, shared) and One.__name__ == shared.__name__ and One.__qualname__ == shared.__qualname__
    assert One.event_name == "users.registered"
