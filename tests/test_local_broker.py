"""Ports for a private node (no broker needed)."""

from __future__ import annotations

import socket

from amqp_events.local.processes import ephemeral_range, free_ports


def test_free_ports_are_distinct_bindable_and_outside_theephemeral_range():
    low, high = ephemeral_range()
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert not any(low <= port <= high for port in ports)  # no outgoing connection can take them meanwhile
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
