"""The dispatcher over whole message spaces and every outcome a host's run can end in (no broker, no Celery): each
message is carried out one way, and settled once, with the answer the acknowledgement policy gives."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.message import Message

from amqp_events import Reason
from amqp_events.core.delivery import Answer, Delivery
from amqp_events.core.handler import Handler
from amqp_events.core.outcome import Ack, Hold, Outcome, Redeliver, RejectedByHandler, SendToArchive, answer_of
from amqp_events.core.router import ToArchive, ToHandler
from amqp_events.dispatch.dispatcher import Dispatcher
from amqp_events.dispatch.settling import ChannelSettler
from amqp_events.errors import AlreadySettled
from amqp_events.wire.message import OutgoingMessage
from tests.unit.test_router import app, messages

COPY = OutgoingMessage("orders.direct", "orders:billing.invoice.paid", {}, [[], {}, {}], "e1")
#: What a host's run may end in: each outcome, the host taking the run over (``None``), the handler's own reject,
#: and settling failing (the broker gone: an exception).
ENDINGS: list[Outcome | RejectedByHandler | Exception | None] = [
    Ack(),
    Ack(duplicate=True),
    Redeliver(COPY, 4, ValueError("x")),
    Redeliver(COPY, 0, ValueError("lost"), why="redeliver"),
    SendToArchive(COPY, Reason.MAX_RETRIES, ValueError("x"), 3),
    Hold(2.0, ValueError("over its limit")),
    None,
    RejectedByHandler(requeue=True),
    RejectedByHandler(requeue=False),
    ConnectionError("the broker went away"),
]


def sent(ending: Any) -> str:
    """What the broker gets after ``ending``: an ack, unless the handler rejected its message or settling failed."""
    if isinstance(ending, RejectedByHandler):
        return "requeue" if ending.requeue else "reject"
    return "reject" if isinstance(ending, Exception) else "ack"


class Host:
    """A host whose runs end in ``ending``, and whose own path takes ``handlers_it_takes`` over."""

    logs_runs = False

    def __init__(self, ending: Any, takes: bool) -> None:
        self.ending, self.takes, self.runs, self.taken = ending, takes, 0, 0

    def run(self, handler: Handler, delivery: Delivery, info: Mapping[str, Any], can_hold: bool = False) -> Any:
        self.runs += 1
        if isinstance(self.ending, Exception):
            raise self.ending
        return self.ending

    def takes_over(self, handler: Handler) -> bool:
        return self.takes

    def take_over(self, handler: Handler, message: Any) -> None:
        self.taken += 1

    def received(self, handler: Handler, delivery: Delivery) -> None: ...

    def succeeded(self, handler: Handler, delivery: Delivery, seconds: float) -> None: ...


class Recorded:
    """What the dispatcher's other parts were given: the archiver's routes, the timer's held runs."""

    def __init__(self) -> None:
        self.archived: list[Any] = []
        self.held: list[tuple[float, Callable[..., Any], tuple[Any, ...]]] = []

    def take(self, message: Any, settler: Any, route: Any, queue: str = "") -> None:
        self.archived.append(route)

    def call_after(self, seconds: float, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.held.append((seconds, function, args))


class Answers:
    """A delivered message's channel: the answers it got."""

    def __init__(self, message: Any) -> None:
        self.got: list[str] = []
        message.ack = lambda: self.got.append("ack")
        message.reject = lambda requeue: self.got.append("requeue" if requeue else "reject")


def dispatcher(host: Host, recorded: Recorded, revoked: frozenset[str] = frozenset()) -> Dispatcher:
    return Dispatcher(lambda: app.context, host, recorded, lambda: None, revoked=revoked, timer=recorded)  # type: ignore[arg-type]


def carried_out_once(message: Any, queue: str, ending: Any, takes: bool, revoke: bool) -> Any:
    """Dispatch ``message``; check it was carried out one way and settled once, as the policy says."""
    host, recorded, channel = Host(ending, takes), Recorded(), Answers(message)
    settler = ChannelSettler(message)
    ident = message.headers.get("id")
    revoked = frozenset({ident}) if revoke and isinstance(ident, str) else frozenset()
    routed = dispatcher(host, recorded, revoked).dispatch(message, queue, settler)
    if isinstance(routed, ToHandler) and routed.batch:  # its events run one by one (tests/unit/test_replay_batches.py)
        return routed
    assert [bool(recorded.archived), bool(host.taken), bool(host.runs)].count(True) == 1
    if not isinstance(routed, ToHandler):
        assert recorded.archived == [routed] and channel.got == []  # the archiver settles, after its copy
        if isinstance(routed, ToArchive) and routed.reason is Reason.REVOKED:  # kept, for its handler's replay
            assert revoked and routed.handler is not None
        return routed
    assert not revoked  # a revoked event runs nowhere
    if host.taken:
        return routed
    if isinstance(ending, Hold):  # kept unacked, and run again later, then settled once
        assert channel.got == [] and [seconds for seconds, _, _ in recorded.held] == [2.0]
        host.ending = Ack()
        _, function, args = recorded.held[0]
        function(*args)
        assert channel.got == ["ack"] and host.runs == 2
        return routed
    assert channel.got == [sent(ending)]
    assert settler.answer == (Answer.REJECT if isinstance(ending, Exception) else answer_of(ending)).value
    return routed


@settings(max_examples=400)
@given(messages(), st.sampled_from(ENDINGS), st.booleans(), st.booleans())
def test_any_message_is_carried_out_one_way_and_settled_once_with_the_policy_s_answer(drawn, ending, takes, revoke):
    message, queue, _ = drawn
    carried_out_once(message, queue, ending, takes, revoke)


@pytest.mark.parametrize("revoke", [False, True])
@pytest.mark.parametrize("takes", [False, True])
@pytest.mark.parametrize("ending", ENDINGS, ids=repr)
def test_a_run_ends_in_each_outcome_and_gets_the_policy_s_answer(ending, takes, revoke):
    routed = carried_out_once(paid(), "orders:billing.invoice.paid", ending, takes, revoke)
    assert isinstance(routed, ToArchive if revoke else ToHandler)


def paid() -> Message:
    return Message(body=json.dumps([[42, "10.00"], {}, {}]), headers={"task": "billing.invoice.paid", "id": "e1"},
                   content_type="application/json", content_encoding="utf-8", channel=None,
                   delivery_info={"exchange": "events", "routing_key": "billing.invoice.paid"})  # fmt: skip


def test_a_second_answer_of_a_dispatched_message_raises():
    message = paid()
    settler, channel = ChannelSettler(message), Answers(message)
    dispatcher(Host(Ack(), False), Recorded()).dispatch(message, "orders:billing.invoice.paid", settler)
    assert channel.got == ["ack"]
    with pytest.raises(AlreadySettled):
        settler.settle(Answer.REJECT)
    assert channel.got == ["ack"]
