"""What moving a service between queue layouts changes on the broker, and where each waiting message goes (pure)."""

from __future__ import annotations

from dataclasses import replace

from amqp_events.settings import Settings
from amqp_events.topology.moving import move_to
from amqp_events.wire.message import event_name

TASKS_PER_HANDLER = {
    "user.created": ("user.created", "accounts:user.created"),
    "user.created:welcome": ("user.created", "accounts:user.created:welcome"),
    "user.deleted": ("user.deleted", "accounts:user.deleted"),
}
TASKS_PER_SERVICE = {task: (event, "accounts.events") for task, (event, _) in TASKS_PER_HANDLER.items()}
PER_SERVICE = replace(Settings(), queue_layout="per_service")


def routes(bindings) -> set[tuple[str, str, str]]:
    return {(link.source.name, link.destination.name, link.routing_key) for link in bindings}


def test_into_the_per_service_layout_each_handler_queue_is_unbound_and_its_name_routed_to_the_shared_queue():
    move, topology = move_to("accounts", TASKS_PER_SERVICE, PER_SERVICE, [])
    assert [queue.name for queue in topology.event_queues] == ["accounts.events"]
    old = {queue.name: queue for queue in move.old}
    assert set(old) == {"accounts:user.created", "accounts:user.created:welcome", "accounts:user.deleted"}
    welcome = old["accounts:user.created:welcome"]
    assert ("events", "accounts:user.created:welcome", "user.created") in routes(welcome.routes)
    assert ("accounts.direct", "accounts:user.created:welcome", "accounts:user.created:welcome") in routes(
        welcome.routes
    )
    assert routes(welcome.redirects) == {
        ("accounts.direct", "accounts.events", "accounts:user.created:welcome"),
        ("amqp_events.delivery", "accounts.events", "*." * 22 + "queue.accounts:user.created:welcome"),
        ("accounts.delayed", "accounts.events", "*." * 22 + "queue.accounts:user.created:welcome"),  # its own ladder
    }


def test_a_message_goes_to_the_handler_it_names_or_whose_queue_it_was_in_or_to_every_handler_of_its_event():
    move, _ = move_to("accounts", TASKS_PER_HANDLER, Settings(), [])
    [shared] = move.old
    assert shared.name == "accounts.events"

    def tasks(queue, headers):
        return sorted(target.task for target in move.destinations(queue, headers, event_name(headers)))

    assert tasks(shared.name, {"task": "user.created"}) == ["user.created", "user.created:welcome"]
    assert tasks(shared.name, {"task": "user.created", "for_handler": "user.created"}) == ["user.created"]
    assert tasks(shared.name, {"task": "user.deleted"}) == ["user.deleted"]
    assert tasks(shared.name, {"task": "no.such"}) == []
    into_shared, _ = move_to("accounts", TASKS_PER_SERVICE, PER_SERVICE, [])
    [target] = into_shared.destinations("accounts:user.created", {"task": "user.created"}, "user.created")
    assert target.task == "user.created"


def test_ordered_handlers_keep_their_partitions_through_a_move():
    tasks = {**TASKS_PER_SERVICE, "ledger.posted": ("ledger.posted", "accounts.ordered.intake")}
    move, topology = move_to("accounts", tasks, PER_SERVICE, ["ledger.posted"])
    assert "ledger.posted" not in move.targets
    assert all(not old.name.startswith("accounts.ordered") for old in move.old)
    assert "accounts.ordered.intake" in {queue.name for queue in topology.queues}
