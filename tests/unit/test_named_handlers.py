"""Several handlers of one event in one service: registration rules and their queues (no broker)."""

from __future__ import annotations

import pytest

from amqp_events import DuplicateHandler, events_app
from amqp_events.errors import InvalidName
from amqp_events.wire.message import event_name


@pytest.fixture
def app():
    return events_app("accounts", broker_url="amqp://localhost//")


def test_a_named_handler_has_its_own_task_and_queue_bound_to_its_event(app):
    @app.handler("user.created")
    def create_account(user_id): ...

    @app.handler("user.created", name="welcome_email")
    def send_welcome_email(user_id): ...

    assert set(app.handlers) == {"user.created", "user.created:welcome_email"}
    named = app.handlers["user.created:welcome_email"]
    assert (named.label, named.task_name, named.queue) == (
        "welcome_email",
        "user.created:welcome_email",
        "accounts:user.created:welcome_email",
    )
    assert app.tasks["user.created:welcome_email"].handler is named
    queues = {queue.name: queue.routing_key for queue in app.context.topology.event_queues}
    assert queues == {"accounts:user.created": "user.created", "accounts:user.created:welcome_email": "user.created"}


def test_named_handlers_alone_need_no_unnamed_one(app):
    @app.handler("user.created", name="welcome_email")
    def send_welcome_email(user_id): ...

    @app.handler("user.created", name="account_manager")
    def notify_account_manager(user_id): ...

    assert {queue.name for queue in app.context.topology.event_queues} == {
        "accounts:user.created:welcome_email",
        "accounts:user.created:account_manager",
    }


def test_an_unnamed_second_handler_is_still_a_duplicate(app):
    @app.handler("user.created", name="welcome_email")
    def send_welcome_email(user_id): ...

    @app.handler("user.created")
    def create_account(user_id): ...

    with pytest.raises(DuplicateHandler, match="its own name") as error:

        @app.handler("user.created")
        def another(user_id): ...

    assert isinstance(error.value, RuntimeError) and "create_account" in str(error.value)


def test_two_handlers_of_one_name_are_a_duplicate(app):
    @app.handler("user.created", name="welcome_email")
    def first(user_id): ...

    with pytest.raises(DuplicateHandler, match="named 'welcome_email'"):

        @app.handler("user.created", name="welcome_email")
        def second(user_id): ...


@pytest.mark.parametrize("name", ["", "a.b", "a:b", "with space", 7])
def test_a_handler_name_is_one_word(app, name):
    with pytest.raises(InvalidName):

        @app.handler("user.created", name=name)
        def handler(user_id): ...


def test_a_named_handler_cannot_be_ordered(app):
    with pytest.raises(TypeError, match="cannot be ordered"):

        @app.handler("user.created", name="welcome_email", ordered_by="user_id")
        def send_welcome_email(user_id): ...


def test_a_copy_for_a_named_handler_still_names_its_event():
    assert event_name({"task": "user.created:welcome_email"}) == "user.created"
    assert event_name({"task": "user.created"}) == "user.created"
