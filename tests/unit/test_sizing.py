"""What quorum queues cost, in words, and the note `topology check` adds past the warning (pure)."""

from __future__ import annotations

from amqp_events import events_app
from amqp_events.topology import sizing
from amqp_events.topology.check import LiveTopology, differences


def test_the_cost_of_a_fleet_s_queues_per_node():
    assert sizing.cost(5123) == "about 795 MB of memory, 17% of a core idle and 33 s to restart, per node"
    assert sizing.quorum_queues([{"type": "quorum"}, {"type": "classic"}, {"type": "stream"}, {}]) == 1


def test_check_notes_a_vhost_past_the_warning_and_says_nothing_below_it():
    topology = events_app("sizing", broker_url="amqp://localhost//").topology
    live = LiveTopology(queues={f"q{n}": {"type": "quorum"} for n in range(12)}, nodes=["rabbit@a"])
    [note] = [found for found in differences(topology, live, "/", quorum_queue_warning=10) if found.entity == "vhost"]
    assert not note.wrong and "12 quorum queues, more than amqp_events_quorum_queue_warning (10)" in str(note)
    assert not [found for found in differences(topology, live, "/", quorum_queue_warning=12) if found.entity == "vhost"]
    assert not [found for found in differences(topology, live, "/") if found.entity == "vhost"]
