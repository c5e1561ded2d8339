"""Acks held and sent together on a real channel (amqp_events.transport.acks): a run of settled deliveries is
one frame, a delivery still running stays outstanding and comes back when its channel closes, a channel the
broker closed and py-amqp opened again starts its count afresh, and the ack of a message a copy replaced is never
held."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from amqp.exceptions import NotFound
from kombu import Connection, Consumer, Producer, Queue
from kombu.asynchronous.timer import Timer
from kombu.message import Message

from amqp_events.celery.loop import acked_unheld
from amqp_events.core.delivery import Answer
from amqp_events.dispatch.settling import ChannelSettler
from amqp_events.testing import wait_for
from amqp_events.transport import acks
from amqp_events.transport.acks import HeldAcks
from amqp_events.wire.message import LOST_RUNS

COUNT = 40


@pytest.fixture(autouse=True)
def unhurried(monkeypatch: pytest.MonkeyPatch) -> None:
    """What holds acks here is the channel's rules, not the clock (the unit tests vary that): a loaded machine can
    take more than 2 ms between two acks of a loop, which would send them one by one."""
    monkeypatch.setattr(acks, "HOLD_GAP", 20.0)
    monkeypatch.setattr(acks, "MAX_HOLD", 20.0)


def filled(connection: Connection, count: int) -> tuple[Queue, Any]:
    """A new queue holding ``count`` messages (``{"n": 0}``, ...), and a channel to consume them all at once."""
    queue = Queue(f"acks-{uuid.uuid4().hex[:8]}", durable=False, auto_delete=False)
    channel = connection.channel()
    queue(channel).declare()
    producer = Producer(connection.channel())
    for n in range(count):
        producer.publish({"n": n}, routing_key=queue.name, serializer="json")
    channel.basic_qos(0, count, False)
    return queue, channel


def once_unconsumed(channel: Any, queue: Queue) -> Any:
    """``queue``'s state (``queue.declare-ok``) once the closed channel's consumer is gone from it: RabbitMQ gives
    back what that channel held as it takes the consumer off, which a close does not wait for on every line."""
    return wait_for(
        lambda: (ok := channel.queue_declare(queue.name, passive=True)).consumer_count == 0 and ok,
        10,
        what=f"{queue.name} without a consumer",
    )


def test_a_run_of_acks_is_one_frame_and_a_delivery_still_running_stays_outstanding(broker_url):
    with Connection(broker_url) as connection:
        queue, channel = filled(connection, COUNT)
        received = []
        held = HeldAcks(channel, lambda: COUNT, Timer().call_after)
        frames: list[tuple[int, bool]] = []
        send = held._ack
        held._ack = lambda tag, multiple=False: (frames.append((tag, multiple)), send(tag, multiple))
        with Consumer(channel, [queue], callbacks=[lambda body, message: received.append(message)]):
            while len(received) < COUNT:
                connection.drain_events(timeout=10)
            for message in received[:20]:
                message.ack()
            held.send()
            # The first of a run goes out at once (nothing came just before it); the other nineteen are one frame.
            assert frames == [(1, False), (20, True)]
            running = received[29]
            for message in received[20:29] + received[30:]:
                message.ack()
            held.send()
            assert frames[2] == (29, True)  # up to the one still running
            assert frames[3:] == [(tag, False) for tag in range(31, COUNT + 1)]  # above it: alone
            with Connection(broker_url) as looking:
                ok = looking.default_channel.queue_declare(queue.name, passive=True)
                assert ok.message_count == 0  # none ready: every message is settled or still running
            held.uninstall()
            channel.close()  # the running one goes back to its queue
        with Connection(broker_url) as looking:
            back = looking.default_channel
            assert once_unconsumed(back, queue).message_count == 1
            message = back.basic_get(queue.name, no_ack=True)
            assert message is not None and json.loads(message.body) == {"n": 29}
            assert running.delivery_tag == 30
            back.queue_delete(queue.name)


def test_a_channel_opened_again_never_settles_its_new_deliveries_with_the_old_count(broker_url):
    with Connection(broker_url) as connection:
        queue, channel = filled(connection, 10)
        held = HeldAcks(channel, lambda: 100, Timer().call_after)
        received: list = []

        def take(count: int) -> None:
            received.clear()
            with Consumer(channel, [queue], callbacks=[lambda body, message: received.append(message)]):
                while len(received) < count:
                    connection.drain_events(timeout=10)

        take(10)
        for message in received[:6]:
            message.ack()  # the first goes out at once, the next five are held
        with pytest.raises(NotFound):  # the broker closes the channel; py-amqp opens it again, same object
            channel.queue_declare(f"missing-{uuid.uuid4().hex[:8]}", passive=True)
        assert channel.is_open
        take(9)  # the five held and the four never acked, delivered again and numbered from 1
        assert sorted(json.loads(message.body)["n"] for message in received) == list(range(1, 10))
        frames: list[int] = []
        send = held._ack
        held._ack = lambda tag, multiple=False: (frames.append(tag), send(tag, multiple))
        for message in received[4:]:
            message.ack()  # deliveries 5-9 of the new count, while 1-4 still run
        assert frames == [5, 6, 7, 8, 9]  # each at once: an ack of the old count could name a new delivery
        with Connection(broker_url) as looking:
            ok = looking.default_channel.queue_declare(queue.name, passive=True)
            assert ok.message_count == 0
        held.uninstall()
        channel.close()  # the four still running go back
        with Connection(broker_url) as looking:
            back = looking.default_channel
            assert once_unconsumed(back, queue).message_count == 4
            back.queue_delete(queue.name)


def test_acks_wait_for_the_runs_about_to_end_and_the_timer_sends_them_while_the_loop_waits(broker_url):
    """Celery's pool ends its runs in other processes, and each result wakes the event loop: while some run, the
    acks held wait for theirs (one frame), and if the loop then waits, its timer sends them after MAX_HOLD."""
    with Connection(broker_url) as connection:
        queue, channel = filled(connection, 6)
        timers: list[tuple[float, Callable[[], None]]] = []

        def call_later(delay: float, callback: Callable[[], None]) -> Any:
            timers.append((delay, callback))
            return timers[-1]

        held = HeldAcks(channel, lambda: 100, call_later)
        frames: list[tuple[int, bool]] = []
        send = held._ack
        held._ack = lambda tag, multiple=False: (frames.append((tag, multiple)), send(tag, multiple))
        received: list = []
        with Consumer(channel, [queue], callbacks=[lambda body, message: received.append(message)]):
            while len(received) < 6:
                connection.drain_events(timeout=10)
            for message in received[:3]:
                message.ack()  # the first at once, two held
            held.send_if_waiting(running=3)
            assert frames == [(1, False)] and [delay for delay, _ in timers] == [acks.MAX_HOLD]
            for message in received[3:5]:
                message.ack()
            held.send_if_waiting(running=1)
            assert frames == [(1, False)] and len(timers) == 1  # one timer for what is held
            timers[0][1]()  # the loop waited in its poll: the timer fires
            assert frames == [(1, False), (5, True)]
            received[5].ack()
            held.send_if_waiting(running=0)  # nothing runs, nothing to read: at once
            assert frames[-1] == (6, False) and len(timers) == 1
            held.uninstall()
        channel.queue_delete(queue.name)


def marker(held: HeldAcks) -> Callable[[Message], None]:
    return lambda message: held.never_hold(message.delivery_tag)


def replaced_by_the_router(message: Message, held: HeldAcks) -> None:
    ChannelSettler(message, never_hold=marker(held)).settle(Answer.ACK_REPLACED)


def acked_by_celery_s_path(message: Message, held: HeldAcks) -> None:
    message.headers[LOST_RUNS] = 1  # a lost run's copy (whose own copy would be the next delivery)
    acked_unheld(lambda handed: handed.ack(), marker(held))(message)


def replaced_in_a_pool_process(message: Message, held: HeldAcks) -> None:
    acks.ack_at_once(message)  # a prefork child's retry, archive or lost run (EventRequest.acknowledge_replaced)
    message.ack()


@pytest.mark.parametrize("ack", [replaced_by_the_router, acked_by_celery_s_path, replaced_in_a_pool_process])
def test_the_ack_of_a_message_a_copy_replaced_goes_out_at_once_with_what_is_held(broker_url, ack):
    """A retry's or a lost run's copy is published, then its original acked. Held, that ack would die with a
    process its copy kills next (the copy is the next delivery): the original would come back beside its copy,
    and a lost run go uncounted. So it goes out at once, with what is held; and so does, on Celery's request path
    where handlers run in-process (whether a copy replaced its message is not known there), the ack of a message
    that may be counted as a lost run."""
    dying = Connection(broker_url)
    try:
        queue, channel = filled(dying, 4)
        held = HeldAcks(channel, lambda: 100, Timer().call_after)
        received: list = []
        Consumer(channel, [queue], callbacks=[lambda body, message: received.append(message)]).consume()
        while len(received) < 4:
            dying.drain_events(timeout=10)
        ChannelSettler(received[0], never_hold=marker(held)).settle(Answer.ACK)  # the first of a run: at once
        ChannelSettler(received[1], never_hold=marker(held)).settle(Answer.ACK)  # held
        ack(received[2], held)
        channel.queue_declare(queue.name, passive=True)  # a round trip: what was sent is taken (the fourth runs)
        dying.connection.sock.close()  # the process dies running the fourth: nothing more is sent
    finally:
        dying.collect()
    with Connection(broker_url) as looking:
        back = looking.default_channel
        assert once_unconsumed(back, queue).message_count == 1
        message = back.basic_get(queue.name, no_ack=True)
        assert message is not None and json.loads(message.body) == {"n": 3}  # only the one running came back
        back.queue_delete(queue.name)
