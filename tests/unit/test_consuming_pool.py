"""The consuming pool's pure parts: which command gets it, and what its processes share (runs, deadlines)."""

from __future__ import annotations

import time

import click
import pytest
from celery.bin.worker import worker as worker_command
from celery.worker import state as worker_state
from click.core import ParameterSource
from hypothesis import given
from hypothesis import strategies as st

from amqp_events.celery import events_app
from amqp_events.celery.pool import ConsumingPool, chosen_by_default
from amqp_events.celery.pool.mirror import Mirror, ProcessRun
from amqp_events.celery.pool.shared import LOST_KEPT, RUNS_PER_SLOT, Revoked, Shared, SlotRuns, run_key


def typed(pool_source: ParameterSource) -> click.Context:
    context = click.Context(worker_command, info_name="worker")
    context.params["pool"] = "prefork"
    context.set_parameter_source("pool", pool_source)
    return context


def test_the_command_with_no_pool_named_gets_it_and_a_pool_named_anywhere_keeps_celery_s():
    app = events_app("orders", broker_url="memory://")
    assert not chosen_by_default(app.conf)  # not the `celery worker` command (a worker made in code)
    with typed(ParameterSource.DEFAULT):
        assert chosen_by_default(app.conf)
    with typed(ParameterSource.COMMANDLINE):  # -P prefork
        assert not chosen_by_default(app.conf)
    with typed(ParameterSource.ENVIRONMENT):
        assert not chosen_by_default(app.conf)
    for named in (events_app("orders", broker_url="memory://", worker_pool="prefork"),):
        with typed(ParameterSource.DEFAULT):
            assert not chosen_by_default(named.conf)

    class Configuration:
        worker_pool = "prefork"

    configured = events_app("orders", broker_url="memory://")
    configured.config_from_object(Configuration)
    with typed(ParameterSource.DEFAULT):
        assert not chosen_by_default(configured.conf)


def test_a_run_of_a_dead_process_is_lost_once_and_its_copy_sent_back_is_another_run():
    shared = Shared(2, ["a", "b"])
    first, second = SlotRuns(shared, 0), SlotRuns(shared, 1)
    key = run_key("a", "e1", 0, 0)
    place = first.started(key)
    assert shared.was_lost(key)  # delivered again while written down: the process that ran it lost it
    assert not shared.was_lost(key)  # once
    assert not shared.was_lost(run_key("a", "e1", 0, 1))  # the copy sent back for the loss
    first.ended(place)
    other = run_key("b", "e2", 0, 0)
    second.started(other)
    shared.process_ended(1)  # the main process saw it die: kept among the lost runs
    assert shared.was_lost(other) and not shared.was_lost(other)
    assert not shared.was_lost(run_key("b", "e3", 0, 0))  # only prefetched: never written down


@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["start", "end", "die"])), max_size=60))
def test_slots_never_claim_a_run_that_ended_and_always_claim_one_that_did_not(steps):
    shared = Shared(3, ["h"])
    slots = [SlotRuns(shared, slot) for slot in range(3)]
    running: dict[int, list[tuple[bytes, int | None]]] = {0: [], 1: [], 2: []}
    ended: list[bytes] = []
    lost: list[bytes] = []
    counter = 0
    for slot, step in steps:
        if step == "start":
            counter += 1
            key = run_key("h", f"e{counter}", 0, 0)
            running[slot].append((key, slots[slot].started(key)))
        elif step == "end" and running[slot]:
            key, place = running[slot].pop(0)
            slots[slot].ended(place)
            ended.append(key)
        elif step == "die":  # its runs are lost; another process takes the slot
            shared.process_ended(slot)
            lost += [key for key, place in running[slot] if place is not None]
            running[slot] = []
            slots[slot] = SlotRuns(shared, slot)
    for key in ended:
        assert not shared.was_lost(key)
    for key in lost + [key for runs in running.values() for key, place in runs if place is not None]:
        assert shared.was_lost(key)  # written down (at most RUNS_PER_SLOT at once), so told apart
    assert all(len(bytes(array).strip(b"\0")) == 0 for array in shared.runs)


def test_a_slot_holds_its_earliest_deadline_and_the_main_process_finds_it_overdue():
    shared = Shared(2, ["slow", "quick"])
    runs = SlotRuns(shared, 1)
    late = runs.limit(0, 60)
    soon = runs.limit(1, 0.01)
    assert shared.overdue(time.monotonic()) == []
    [overdue] = shared.overdue(time.monotonic() + 1)
    assert (overdue.slot, overdue.handler) == (1, "quick")
    runs.unlimit(soon)
    assert shared.overdue(time.monotonic() + 1) == []
    runs.unlimit(late)
    assert shared.deadline[1] == 0.0


@pytest.mark.parametrize("count", [RUNS_PER_SLOT + 1])
def test_a_full_slot_says_so_and_the_broker_s_count_decides_for_the_rest(count):
    shared = Shared(1, ["h"])
    runs = SlotRuns(shared, 0)
    places = [runs.started(run_key("h", f"e{n}", 0, 0)) for n in range(count)]
    assert places[-1] is None and None not in places[:-1]
    assert LOST_KEPT > 0


def test_the_queues_cancelled_by_remote_control_are_shared_and_only_those_of_the_app():
    shared = Shared(2, ["h"], ["orders:a", "orders:b", "orders:c"], {"orders:c"})  # c: not selected (-Q)
    assert shared.cancelled_queues() == {"orders:c"}
    assert shared.consume("orders:b", False) and shared.cancelled_queues() == {"orders:b", "orders:c"}
    assert not shared.consume("orders:new", False)  # not one of the app's queues: nothing to follow
    assert shared.consume("orders:b", True) and shared.consume("orders:c", True) and not shared.cancelled_queues()
    assert Shared(1, ["h"]).cancelled_queues() == set()


def test_a_process_that_died_no_longer_counts_as_consuming():
    shared = Shared(2, ["h"])
    shared.consuming[0] = shared.consuming[1] = 1
    shared.process_ended(1)
    assert list(shared.consuming) == [1, 0]


def test_the_pool_shares_every_queue_of_the_app_a_handler_imported_late_included():
    app = events_app("shop", broker_url="memory://")

    @app.handler("order.placed")
    def on_placed() -> None: ...

    app.amqp.queues  # noqa: B018 (the table made before the worker imports --include modules)

    @app.handler("order.paid")
    def on_paid() -> None: ...

    shared = ConsumingPool(2, app=app).shared
    assert {"shop:order.placed", "shop:order.paid"} <= set(shared.queues)
    assert shared.cancelled_queues() == set()  # no -Q: every queue consumed


# -- what remote control reads and steers ---------------------------------------------------------------------


class Alive:
    """A process as the main process sees it: its pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid


@pytest.fixture
def celery_state():
    """Celery's worker state of this process (module globals), empty before and after."""
    worker_state.reset_state()
    yield worker_state
    worker_state.reset_state()


def test_the_runs_in_progress_are_celery_s_active_requests_until_they_end_and_their_ends_its_totals(celery_state):
    shared = Shared(2, ["a.b", "c.d"])
    mirror = Mirror(shared, "w1@host")
    slot = SlotRuns(shared, 1)
    place = slot.started(run_key("a.b", "e1", 0, 0), b'a.b\0e1\0events\0a.b\0[[7], {"k": "v"}]')
    mirror.sync([Alive(10), Alive(11)])
    [run] = worker_state.active_requests
    assert worker_state.requests["e1"] is run and run in worker_state.reserved_requests
    info = run.info()
    assert (info["id"], info["name"], info["args"], info["kwargs"], info["worker_pid"]) == (
        "e1", "a.b", [7], {"k": "v"}, 11,
    )  # fmt: skip
    assert info["delivery_info"]["routing_key"] == "a.b" and run.info(safe=True)["args"] == "[7]"
    slot.ended(place, 0)
    mirror.sync([Alive(10), Alive(11)])
    assert not worker_state.active_requests and "e1" not in worker_state.requests
    assert worker_state.total_count == {"a.b": 1} and worker_state.all_total_count[0] == 1
    # A process that died mid-run leaves nothing active behind.
    slot.started(run_key("c.d", "e2", 0, 0), b"c.d\0e2\0\0\0[[], {}]")
    shared.process_ended(1)
    mirror.sync([Alive(10), None])
    assert not worker_state.active_requests


def test_a_run_whose_arguments_did_not_fit_its_slot_shows_what_it_held():
    run = ProcessRun(b'a.b\0e1\0events\0a.b\0[["' + b"x" * 50, 0.0, 5, "w1@host")
    assert run.args == ['[["' + "x" * 50 + "…"] and run.kwargs == {}


@given(st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=20))
def test_a_process_knows_every_revoked_id_as_soon_as_the_main_process_wrote_it(ids):
    shared = Shared(1, ["a.b"])
    seen = Revoked(shared)
    assert "never" not in seen
    shared.revoke(ids)
    assert all(event_id in seen for event_id in ids if len(event_id.encode()) < 200)
    assert "never" not in seen
