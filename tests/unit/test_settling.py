"""ChannelSettler: an answer given in another thread than the consumer's is posted to it as one callback. kombu's
hub runs posted callbacks in no set order, so the ack of a replaced message can never overtake its mark (a held
ack would die with a process the message's copy kills next)."""

from __future__ import annotations

import itertools
import re
import threading
from typing import Any, ClassVar

import pytest

from amqp_events.celery.loop import acked_unheld
from amqp_events.core.delivery import Answer
from amqp_events.core.outcome import Ack, Hold, RejectedByHandler, answer_of
from amqp_events.dispatch.settling import ChannelSettler
from amqp_events.errors import AlreadySettled
from amqp_events.wire.message import LOST_RUNS


class Message:
    """A delivered message as kombu gives it, recording what is done with it."""

    delivery_tag = 7

    def __init__(self, done: list[tuple[str, int]]) -> None:
        self.done = done

    def ack(self) -> None:
        self.done.append(("ack", self.delivery_tag))


def posted_from_a_pool_thread(done: list[tuple[str, int]], replaced: bool) -> list[tuple[Any, ...]]:
    """What an ack (``replaced``: :attr:`Answer.ACK_REPLACED`), given in a pool's thread, posts to the consumer's
    thread."""
    posted: list[tuple[Any, ...]] = []
    settler = ChannelSettler(
        Message(done),
        post=lambda *call: posted.append(call),
        never_hold=lambda message: done.append(("mark", message.delivery_tag)),
    )
    answer = Answer.ACK_REPLACED if replaced else Answer.ACK
    thread = threading.Thread(target=settler.settle, args=(answer,))
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and not done  # nothing is done in the pool's thread
    return posted


def run(posted: list[tuple[Any, ...]], order: tuple[int, ...]) -> None:
    for index in order:
        call, *args = posted[index]
        call(*args)


def test_a_replaced_message_is_marked_before_its_ack_in_whatever_order_the_hub_runs_what_was_posted():
    count = len(posted_from_a_pool_thread([], replaced=True))
    for order in itertools.permutations(range(count)):
        done: list[tuple[str, int]] = []
        run(posted_from_a_pool_thread(done, replaced=True), order)
        assert done == [("mark", 7), ("ack", 7)]


def test_an_ack_of_a_run_that_published_nothing_is_not_marked():
    done: list[tuple[str, int]] = []
    posted = posted_from_a_pool_thread(done, replaced=False)
    run(posted, tuple(range(len(posted))))
    assert done == [("ack", 7)]


class Delivered:
    """A message as kombu gives it to Celery's request path."""

    def __init__(self, redelivered: bool, headers: dict[str, Any]) -> None:
        self.delivery_info, self.headers = {"redelivered": redelivered}, headers


@pytest.mark.parametrize(
    ("redelivered", "headers", "marked"),
    [(False, {}, False), (True, {}, True), (False, {LOST_RUNS: 1}, True), (False, {"retries": 2}, False)],
)
def test_celery_s_path_marks_only_a_message_that_may_be_counted_as_a_lost_run(redelivered, headers, marked):
    """Its copy would be published at once, and be the next delivery: every other ack may be held."""
    seen: list[Any] = []
    handed: list[Any] = []
    message = Delivered(redelivered, headers)
    acked_unheld(handed.append, seen.append)(message)
    assert handed == [message] and seen == ([message] if marked else [])


@pytest.mark.parametrize("first", list(Answer))
@pytest.mark.parametrize("second", list(Answer))
def test_a_message_is_settled_once_and_a_second_answer_raises_where_it_is_given(first, second):
    done: list[tuple[str, int]] = []
    settler = ChannelSettler(Answers(done))
    settler.settle(first)
    with pytest.raises(AlreadySettled, match=rf"was {re.escape(first.value)}; it cannot be {re.escape(second.value)}"):
        settler.settle(second)
    assert len(done) == 1  # the broker got the first answer alone


def test_the_one_acknowledgement_policy():
    """Only a run that published nothing is acked plainly: any other outcome's copy (a retry, the archive, or
    Celery's own ``Retry``: ``None``) replaced the message; a handler's ``Reject`` is the broker's reject."""
    assert answer_of(Ack()) is Answer.ACK and answer_of(Ack(duplicate=True)) is Answer.ACK
    assert answer_of(None) is Answer.ACK_REPLACED
    assert answer_of(RejectedByHandler(requeue=True)) is Answer.REQUEUE
    assert answer_of(RejectedByHandler(requeue=False)) is Answer.REJECT
    with pytest.raises(ValueError, match="held"):
        answer_of(Hold(1.0, RuntimeError()))


class Answers(Message):
    headers: ClassVar[dict[str, str]] = {"id": "e-1"}

    def reject(self, requeue: bool) -> None:
        self.done.append(("requeue" if requeue else "reject", self.delivery_tag))
