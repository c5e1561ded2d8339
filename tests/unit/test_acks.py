"""Acks held and sent together (amqp_events.transport.acks): over every order in which a channel's deliveries
are settled, what is sent is what RabbitMQ takes, never settles a delivery still running, and leaves nothing
settled here outstanding on the broker."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_events.transport import acks
from amqp_events.transport.acks import AckWindow


class Broker:
    """A channel's outstanding deliveries as RabbitMQ keeps them."""

    def __init__(self, count: int) -> None:
        self.outstanding = set(range(1, count + 1))
        self.frames = 0

    def ack(self, tag: int, multiple: bool, settled: set[int]) -> None:
        # RabbitMQ closes the channel on an ack of a tag that is not outstanding ("unknown delivery tag").
        assert tag in self.outstanding
        gone = {other for other in self.outstanding if other <= tag} if multiple else {tag}
        assert gone <= settled, f"settled on the broker while still running here: {sorted(gone - settled)}"
        self.outstanding -= gone
        self.frames += 1

    def reject(self, tag: int) -> None:
        assert tag in self.outstanding
        self.outstanding.remove(tag)
        self.frames += 1


def send(window: AckWindow, broker: Broker, settled: set[int]) -> None:
    multiple, alone = window.release()
    if multiple is not None:
        broker.ack(multiple, True, settled)
    for tag in alone:
        broker.ack(tag, False, settled)


#: One channel's deliveries: the order they are settled in, how (ack or reject), where the worker sends what it
#: holds (after which settlement), and how many are still running at the end.
settlements = st.integers(min_value=1, max_value=60).flatmap(
    lambda count: st.tuples(
        st.permutations(range(1, count + 1)),
        st.lists(st.booleans(), min_size=count, max_size=count),
        st.sets(st.integers(min_value=0, max_value=count)),
        st.integers(min_value=0, max_value=count),
    )
)


def replay(order: list[int], acked: list[bool], sends: set[int], running: int) -> tuple[Broker, set[int]]:
    broker, window, settled = Broker(len(order)), AckWindow(), set()
    finished = order[: len(order) - running]
    for step, tag in enumerate(finished):
        settled.add(tag)
        if acked[step]:
            window.hold(tag)
        else:
            window.settle(tag)
            broker.reject(tag)
        if step in sends:
            send(window, broker, settled)
    send(window, broker, settled)
    return broker, settled


@settings(max_examples=400)
@given(settlements)
def test_held_acks_settle_exactly_what_was_settled_here(case):
    order, acked, sends, running = case
    broker, settled = replay(order, acked, sends, running)
    assert broker.outstanding == set(order) - settled


@settings(max_examples=100)
@given(settlements)
def test_past_the_tracking_bound_acks_go_alone_and_stay_right(case):
    order, acked, sends, running = case
    bound, acks.MAX_TRACKED = acks.MAX_TRACKED, 3
    try:
        broker, settled = replay(order, acked, sends, running)
    finally:
        acks.MAX_TRACKED = bound
    assert broker.outstanding == set(order) - settled


def test_a_run_of_acks_in_order_is_one_frame():
    broker, _ = replay(list(range(1, 17)), [True] * 16, set(), 0)
    assert broker.outstanding == set() and broker.frames == 1


def test_acks_above_a_delivery_still_running_go_alone_and_it_stays_outstanding():
    window, broker = AckWindow(), Broker(5)
    for tag in (1, 3, 4, 5):  # 2 runs on
        window.hold(tag)
    send(window, broker, {1, 3, 4, 5})
    assert broker.outstanding == {2} and broker.frames == 4
    window.hold(2)
    send(window, broker, {1, 2, 3, 4, 5})
    assert broker.outstanding == set()
