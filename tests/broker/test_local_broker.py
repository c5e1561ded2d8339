"""Ports for a private node (no broker needed)."""

from __future__ import annotations

import re
import socket

import pytest
from helpers import skip_outside_ci

from amqp_events.local.broker import LocalBroker
from amqp_events.local.processes import ephemeral_range, free_ports


def test_free_ports_are_distinct_bindable_and_outside_theephemeral_range():
    low, high = ephemeral_range()
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert not any(low <= port <= high for port in ports)  # no outgoing connection can take them meanwhile
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_rabbitmq_line_is_found_by_name_or_refused_with_what_to_do(monkeypatch, tmp_path):
    from amqp_events.errors import LocalServerError
    from amqp_events.local.installation import find

    monkeypatch.setenv("AMQP_EVENTS_RABBITMQ_ROOTS", str(tmp_path))  # no root installed there
    monkeypatch.delenv("AMQP_EVENTS_RABBITMQ", raising=False)
    with pytest.raises(LocalServerError, match=re.escape("unknown RabbitMQ line '9.9': 3.10 or 4.0")):
        find("9.9")
    machine = find()
    assert machine.on_the_machine and machine.line in ("3.10", "4.0")
    other = "4.0" if machine.line == "3.10" else "3.10"
    with pytest.raises(LocalServerError, match=re.escape(f"amqp-events broker install {other}")):
        find(other)
    monkeypatch.setenv("AMQP_EVENTS_RABBITMQ", other)  # what the fixtures and `broker start` read
    with pytest.raises(LocalServerError, match=re.escape(f"RabbitMQ {other} is not installed")):
        find()


def test_a_partition_cuts_off_some_nodes_never_none_or_all():
    from amqp_events.errors import LocalServerError
    from amqp_events.local.partition import cut, table_name

    assert table_name("127.9.8") == "amqp_events_127_9_8"
    for side in ([], [0, 1, 2], [3]):
        with pytest.raises(LocalServerError, match="a partition cuts off 1 to 2 of the 3 nodes"):
            cut("127.9.8", side, 3)


@pytest.mark.broker
def test_a_node_of_the_other_rabbitmq_line_starts_from_its_root_and_stops_without_a_trace(tmp_path):
    from amqp_events.local.broker import LocalBroker
    from amqp_events.local.installation import installed
    from amqp_events.local.processes import alive

    roots = [installation for installation in installed() if not installation.on_the_machine]
    if not roots:
        skip_outside_ci("no other RabbitMQ line installed beside the machine's (`amqp-events broker install 4.0`)")
    node = LocalBroker(tmp_path / "node", rabbitmq=roots[0])
    node.start()
    try:
        assert node.management.version() == roots[0].version
        pids = [node.state.server_pid, node.state.epmd_pid]
    finally:
        node.stop()
    assert not any(alive(pid) for pid in pids)


@pytest.mark.broker
@pytest.mark.parametrize(
    ("port", "said"),
    [("dist_port", "dist_port_already_used"), ("management_port", "eaddrinuse")],
)
def test_a_node_whose_port_was_taken_meanwhile_starts_on_another(tmp_path, port, said):
    node = LocalBroker(tmp_path / "node")
    node.state = node._new_state()  # the ports as chosen; then another process binds one of them
    taken = getattr(node.state, port)
    with socket.socket() as squatter:
        squatter.bind((node.state.host, taken))
        squatter.listen()
        node.start()
        try:
            assert getattr(node.state, port) != taken and node.is_running()
            assert said in (tmp_path / "node" / "server.out").read_text()
        finally:
            node.stop()


def listening_addresses(port: int) -> set[str]:
    """The addresses something listens on at TCP ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(address)
    return found


@pytest.mark.broker
def test_a_local_node_listens_on_loopback_only_and_resends_dead_letters_soon(tmp_path):
    node = LocalBroker(tmp_path / "node")
    node.start()
    try:
        loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1
        for what, port in (("epmd", node.state.epmd_port), ("distribution", node.state.dist_port)):
            addresses = listening_addresses(port)
            assert addresses and addresses <= loopback, f"{what} listens on {addresses}"
        # A retry the delay ladder could not pass on while a queue was coming back is resent after 10 s, not 3 min.
        setting = node.rabbitmqctl("eval", "application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout).")
        assert setting.strip() == "{ok,10000}"
    finally:
        node.stop()


def test_broker_install_of_a_line_already_there_says_so_and_changes_nothing():
    import subprocess

    from helpers import AMQP_EVENTS

    from amqp_events.local.installation import installed

    for found in installed():  # the machine's own line, and any installed beside it
        command = [AMQP_EVENTS, "broker", "install", found.line]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"RabbitMQ {found.version} is installed" in done.stdout
