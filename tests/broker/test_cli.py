"""The ``amqp-events`` command line against a real broker."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import AMQP_EVENTS, TESTS, wait_archived
from kombu import Connection

from amqp_events.cli import main
from amqp_events.errors import TopologyMissing
from amqp_events.local.broker import LocalBroker
from amqp_events.local.installation import roots_directory
from amqp_events.local.processes import alive, start_session
from amqp_events.testing import wait_for


def fill(worker, producer, archive, tags, event="test.ping"):
    ids = [producer.fire(event, [tag], {"how": {"permanent": True}}) for tag in tags]
    wait_archived(archive, len(tags))
    return ids


@pytest.mark.line_dependent("x-death and the archive through the management API")
def test_archive_list_and_show_describe_real_failures(worker, producer, archive_of, cli):
    worker("orders")
    ids = fill(worker, producer, archive_of("orders"), ["a", "b"])
    table = cli("archive", "list")
    assert table.exit_code == 0, table.output
    assert "REASON" in table.output and "non_retryable" in table.output and "PermanentFailure" in table.output
    assert all(event_id in table.output for event_id in ids) and "2 archived message(s)" in table.output
    rows = json.loads(cli("archive", "list", "--json").output)
    assert [row["id"] for row in rows] == ids
    assert {
        "id",
        "event",
        "service",
        "reason",
        "exception_type",
        "exception_message",
        "attempts",
        "archived_at",
    } <= set(rows[0])
    assert rows[0]["attempts"] == 1 and rows[0]["service"] == "orders"
    shown = cli("archive", "show", ids[0])
    assert "Traceback" in shown.output and "non_retryable" in shown.output
    assert "arguments:\n  [0]:" in shown.output and '  how:              {"permanent": true}' in shown.output, (
        shown.output
    )
    assert "parks_key" not in shown.output and "section:" not in shown.output  # nothing that does not apply
    assert cli("archive", "show", ids[0][:8]).output == shown.output  # a prefix of the id is enough
    assert json.loads(cli("archive", "show", ids[0], "--json").output)["id"] == ids[0]
    assert archive_of("orders").count() == 2  # listing consumed nothing
    missing = cli("archive", "show", "nope")
    assert missing.exit_code == 1 and "no archived message" in missing.output


def test_archive_show_gives_the_routing_key_the_event_was_fired_with(worker, producer, archive_of, cli):
    worker("orders")
    delayed = producer.fire("test.ping", ["d"], {"how": {"permanent": True}}, countdown=1)  # through the ladder
    wait_archived(archive_of("orders"), 1)
    shown = cli("archive", "show", delayed).output
    assert "routing key:        test.ping\n" in shown, shown


def test_replay_after_a_fix_with_the_cli(worker, producer, records, archive_of, cli):
    process = worker("orders")
    ids = fill(worker, producer, archive_of("orders"), ["a", "b", "c"])
    process.stop()
    worker("orders", env={"FIXED": "1"})
    result = cli("archive", "replay", "--yes")
    assert result.exit_code == 0, result.output
    assert "replayed 3 message(s)" in result.output
    assert all(f"replayed {event_id}" in result.output for event_id in ids)
    assert archive_of("orders").count() == 0
    for event_id in ids:
        records.wait(2, id=event_id)
    records.barrier(producer, ("orders",))
    assert all(len(records.all(id=event_id)) == 2 for event_id in ids)


def test_replay_touches_only_the_chosen_messages(worker, producer, archive_of, cli):
    process = worker("orders")
    archive = archive_of("orders")
    _, b, c = fill(worker, producer, archive, ["a", "b", "c"])
    producer.fire("test.orders_only", ["o"], {"how": {"permanent": True}})
    wait_archived(archive, 4)
    process.stop()
    dry = cli("archive", "replay", "--event", "test.orders_only", "--dry-run")
    assert "1 message(s) would be replayed" in dry.output and archive.count() == 4
    assert "replayed 1" in cli("archive", "replay", "--id", b, "--yes").output
    assert "replayed 1" in cli("archive", "replay", "--event", "test.orders_only", "--yes").output
    assert "replayed 1" in cli("archive", "replay", "--limit", "1", "--yes").output
    assert [entry.id for entry in archive.list()] == [c]


def test_replay_asks_first_and_refuses_without_a_terminal(worker, producer, archive_of, cli):
    worker("orders")
    fill(worker, producer, archive_of("orders"), ["a"])
    result = cli("archive", "replay")
    assert result.exit_code == 1 and "--yes" in result.output and archive_of("orders").count() == 1


@pytest.mark.line_dependent("a browse and its acks on a quorum queue")
def test_a_replay_killed_between_publish_and_ack_loses_nothing(worker, producer, archive_of, broker_url):
    process = worker("orders")
    archive = archive_of("orders")
    ids = fill(worker, producer, archive, ["a", "b"])
    process.stop()
    # The replay process dies right after the broker confirmed the first replacement, before its removal.
    script = (
        "import os, signal\n"
        "from services.orders import app\n"
        "app.archive().replay(on_replayed=lambda archived: os.kill(os.getpid(), signal.SIGKILL))\n"
    )
    env = {**os.environ, "BROKER_URL": broker_url, "PYTHONPATH": str(TESTS)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=TESTS, timeout=60, capture_output=True)
    assert done.returncode == -9
    assert sorted(entry.id for entry in archive.list()) == sorted(ids)  # both still archived
    with Connection(broker_url) as connection:  # and one replayed copy exists: a duplicate, not a loss
        queue = connection.default_channel.queue_declare("orders:test.ping", passive=True)
        assert queue.message_count == 1


@pytest.mark.line_dependent("what the management API says of declared queues")
def test_topology_show_declare_and_check(cli, broker_url, monkeypatch):
    shown = json.loads(cli("topology", "show", "--json").output)
    assert "orders:test.ping" in {queue["name"] for queue in shown["queues"]}
    assert "amqp_events.delay.21" in {exchange["name"] for exchange in shown["exchanges"]}
    assert "amqp_events.delay.00" in cli("topology", "show").output
    before = cli("topology", "check")
    assert before.exit_code == 1 and "missing queue 'orders:test.ping'" in before.output
    assert cli("topology", "declare").exit_code == 0
    after = cli("topology", "check")
    assert after.exit_code == 0, after.output
    monkeypatch.setenv("AMQP_EVENTS_QUORUM_QUEUE_WARNING", "10")
    crowded = cli("topology", "check")  # a note, not an error
    assert crowded.exit_code == 0 and "note vhost" in crowded.output, crowded.output
    assert "quorum queues, more than amqp_events_quorum_queue_warning (10): about" in crowded.output


@pytest.mark.line_dependent("declare arguments' equivalence")
def test_topology_check_finds_a_queue_declared_by_hand_with_other_arguments(cli, broker_url):
    with Connection(broker_url) as connection:
        connection.default_channel.queue_declare("orders:test.ping", durable=True, auto_delete=False)
        connection.default_channel.queue_declare("orders:retired.event", durable=True, auto_delete=False)
    cli("topology", "declare")  # fails on the first mismatch, one line
    result = cli("topology", "check")
    assert result.exit_code == 1
    # an untyped queue is classic, as RabbitMQ 4.0 reports it (3.10 reports no type)
    assert "mismatch queue 'orders:test.ping': x-queue-type is 'classic'" in result.output
    assert "this service declares 'quorum'" in result.output and "rabbitmqctl delete_queue" in result.output
    assert "extra queue 'orders:retired.event'" in result.output


def test_fire_from_the_shell(worker, cli, records):
    worker("orders")
    result = cli("fire", "test.ping", "--arg", "tag=shell", "--arg", 'how={"only": "orders"}')
    assert result.exit_code == 0, result.output
    [record] = records.wait(1)
    assert record["id"] == result.output.strip() and record["tag"] == "shell" and record["key"] is None
    keyed = cli("fire", "test.ping", "--arg", "tag=keyed", "--arg", 'how={"only": "orders"}', "--key", "order-9")
    assert keyed.exit_code == 0, keyed.output
    assert records.wait(1, tag="keyed")[0]["key"] == "order-9"
    declared = cli("fire", "users.registered", "--arg", "user_id=5", "--arg", "email=a@b.c", "--key", "5")
    assert declared.exit_code == 2 and "--key is for events fired as given" in declared.output
    assert cli("fire", "billing.invoice.paid", "--json", '[5, "1.00"]').exit_code == 0
    records.wait(1, tag="invoice-5")
    bad = cli("fire", "test.ping", "--json", "{oops")
    assert bad.exit_code == 2 and "not JSON" in bad.output


def test_export_then_import(worker, producer, archive_of, cli, tmp_path):
    worker("orders")
    archive = archive_of("orders")
    ids = fill(worker, producer, archive, ["a", "b"])
    path = tmp_path / "archive.jsonl"
    assert cli("archive", "export", str(path)).exit_code == 0
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ids
    assert "purged 2" in cli("archive", "purge", "--yes").output
    assert "imported 2" in cli("archive", "import", str(path)).output
    assert [entry.id for entry in archive.list()] == ids


def test_expected_failures_are_one_line_and_a_non_zero_status(cli):
    down = cli("--broker", "amqp://guest:guest@127.0.0.1:9/", "archive", "list")
    assert down.exit_code == 1 and down.output.startswith("Error: ") and len(down.output.strip().splitlines()) == 1
    assert "Traceback" not in down.output
    unknown = cli("archive", "list", app="no_such_module")
    assert unknown.exit_code == 1 and "cannot load app 'no_such_module'" in unknown.output
    assert len(unknown.output.strip().splitlines()) == 1
    missing = cli("archive", "list", "--service", "nobody")
    assert missing.exit_code == 1 and "nobody.archive" in missing.output
    assert len(missing.output.strip().splitlines()) == 1


@pytest.mark.line_dependent("starting and stopping a node of the line")
@pytest.mark.broker  # starts a node of its own, on port 5672 when it is free:
@pytest.mark.xdist_group("guides")  # in the test process of the guides tier, which needs that port
def test_broker_start_status_stop_leave_no_process_behind(tmp_path):
    directory = str(tmp_path / "node")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, capture_output=True, text=True, timeout=120)

    started = run(AMQP_EVENTS, "broker", "start", "--dir", directory)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "amqp://guest:guest@127.0.0.1:" in started.stdout
    node = LocalBroker(directory)
    pids = [node.state.server_pid, node.state.epmd_pid, node.beam_pid()]
    assert all(alive(pid) for pid in pids)
    assert run(AMQP_EVENTS, "broker", "status", "--dir", directory).returncode == 0
    assert run(AMQP_EVENTS, "broker", "stop", "--dir", directory).returncode == 0
    assert not any(alive(pid) for pid in pids)  # (a zombie left to init, which may not reap it, has ended)
    assert run(AMQP_EVENTS, "broker", "status", "--dir", directory).returncode == 3


@pytest.mark.line_dependent("the node's own commands")
@pytest.mark.broker  # starts a node of its own, in the default directory under the current one
@pytest.mark.xdist_group("guides")  # port 5672 when it is free, which the guides tier needs
def test_commands_run_against_the_local_broker_find_it_and_its_management_api(tmp_path, monkeypatch):
    """From the directory `broker start` ran in, and from any other (its note in the user's cache)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AMQP_EVENTS_MANAGEMENT_URL", raising=False)
    monkeypatch.setenv("AMQP_EVENTS_RABBITMQ_ROOTS", str(roots_directory()))  # found as before
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # this test's notes only
    runner = CliRunner()
    started = runner.invoke(main, ["broker", "start"])
    try:
        assert started.exit_code == 0, started.output
        url = re.search(r"export AMQP_EVENTS_BROKER_URL='([^']+)' AMQP_EVENTS_MANAGEMENT_URL=http", started.output)
        assert url, started.output
        # A service made without a broker_url, in a shell that ran the export line; no management URL given.
        (tmp_path / "quick.py").write_text(
            "from amqp_events.celery import events_app\n"
            "app = events_app('quick')\n"
            "app.handler('quick.ping')(lambda: None)\n"
        )
        env = {key: value for key, value in os.environ.items() if not key.startswith("AMQP_EVENTS_")}
        env.update(AMQP_EVENTS_BROKER_URL=url.group(1), PYTHONPATH=str(tmp_path))
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()

        def topology(command: str, where: Path) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(Path(sys.executable).parent / "amqp-events"), "-A", "quick", "topology", command],
                cwd=where, env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip

        declared = topology("declare", tmp_path)
        assert declared.returncode == 0, declared.stdout + declared.stderr
        for where in (tmp_path, elsewhere):  # the management API lists a new exchange a moment later (4.0)
            checked = wait_for(lambda where=where: (done := topology("check", where)).returncode == 0 and done, 30,
                               what=f"topology check from {where} to pass")  # fmt: skip
            assert "the broker matches the topology of service 'quick'" in checked.stdout
        status = subprocess.run([str(Path(sys.executable).parent / "amqp-events"), "broker", "status"], cwd=elsewhere,
                                env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert status.returncode == 0 and f"started in {tmp_path / '.amqp-events' / 'broker'}" in status.stdout
        assert url.group(1) in status.stdout, status.stdout
    finally:
        runner.invoke(main, ["broker", "stop"])
    status = subprocess.run([str(Path(sys.executable).parent / "amqp-events"), "broker", "status"], cwd=elsewhere,
                            env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert status.returncode == 3 and not list((tmp_path / "cache" / "amqp-events" / "running").iterdir())


def read_until(fd: int, text: str, timeout: float = 30.0) -> str:
    """What a terminal shows until ``text`` appears (or the program ends)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{text!r} did not appear within {timeout:g}s; the terminal showed:\n{seen.decode()}")
        ready, _, _ = select.select([fd], [], [], remaining)
        try:
            chunk = os.read(fd, 4096) if ready else b""
        except OSError:  # the program ended and closed the terminal
            break
        if ready and not chunk:
            break
        seen += chunk
    return seen.decode(errors="replace")


@pytest.mark.line_dependent("purging through the management API")
def test_purge_deletes_exactly_what_was_shown_and_confirmed(worker, producer, archive_of, broker_url):
    worker("orders")
    archive = archive_of("orders")
    shown = fill(worker, producer, archive, ["a", "b"])
    terminal, its_end = pty.openpty()
    purge = start_session(
        [str(Path(sys.executable).parent / "amqp-events"), "-A", "services.orders", "archive", "purge"],
        stdin=its_end,
        stdout=its_end,
        stderr=its_end,
        cwd=TESTS,
        env={**os.environ, "BROKER_URL": broker_url},
    )
    os.close(its_end)
    try:
        prompt = read_until(terminal, "for good? [y/N]")
        assert all(f"to purge {event_id}" in prompt for event_id in shown)
        late = producer.fire("test.ping", ["late"], {"how": {"permanent": True}})  # archived while it asks
        wait_archived(archive, 3)
        os.write(terminal, b"y\n")
        answer = read_until(terminal, "message(s)")
        assert purge.wait(30) == 0
    finally:
        if purge.poll() is None:
            purge.kill()
        os.close(terminal)
    assert [entry.id for entry in archive.list()] == [late]
    assert all(f"purged {event_id}" in answer for event_id in shown) and late not in answer


def test_a_confirmed_run_reports_the_ids_it_acted_on(worker, producer, archive_of, cli):
    worker("orders")
    ids = fill(worker, producer, archive_of("orders"), ["a", "b", "c"])
    result = cli("archive", "purge", "--limit", "2", "--yes")
    assert result.exit_code == 0, result.output
    assert [line for line in result.output.splitlines() if line.startswith("purged ")] == [
        f"purged {ids[0]}",
        f"purged {ids[1]}",
        "purged 2 message(s)",
    ]
    assert [entry.id for entry in archive_of("orders").list()] == [ids[2]]


def test_topology_and_asyncapi_load_the_app_as_a_worker_does(cli_process):
    """An app whose handlers live in the modules of its ``imports=``: the commands see them, as its worker does."""
    app = "services.loading.by_imports"
    shown = cli_process("topology", "show", app=app)
    assert shown.returncode == 0 and "loaded:loading.ping" in shown.stdout, shown.stderr
    declared = cli_process("topology", "declare", app=app)
    assert declared.returncode == 0, declared.stderr
    checked = cli_process("topology", "check", app=app)
    assert checked.returncode == 0 and "extra" not in checked.stdout, checked.stdout + checked.stderr
    document = cli_process("asyncapi", app=app)
    assert document.returncode == 0 and "loading.ping" in document.stdout, document.stderr


def test_errors_say_which_broker_and_a_closed_pipe_ends_quietly(tmp_path):
    env = {**os.environ, "BROKER_URL": "amqp://guest:s3cret@127.0.0.1:1/", "PYTHONPATH": str(TESTS)}
    amqp_events = str(Path(sys.executable).parent / "amqp-events")
    down = subprocess.run([amqp_events, "-A", "services.orders", "archive", "list"], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert down.returncode == 1 and "(broker amqp://guest:**@127.0.0.1:1//)" in down.stderr
    assert "s3cret" not in down.stderr
    shown = subprocess.Popen([amqp_events, "-A", "services.orders", "topology", "show"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert shown.stdout is not None and shown.stderr is not None
    shown.stdout.close()  # as `| head` does once it has its lines
    assert shown.wait(60) != 0 and b"BrokenPipe" not in shown.stderr.read()


@pytest.mark.line_dependent("deleting queues and exchanges")
def test_a_retired_service_s_queues_and_exchanges_are_gone_and_what_is_shared_stays(
    worker, producer, archive_of, cli_process, rabbitmq, vhost, service_app
):
    service_app("shipping").declare_topology()
    process = worker("orders")
    fill(worker, producer, archive_of("orders"), ["kept"])

    def queues() -> set[str]:
        return {queue["name"] for queue in rabbitmq.management.queues(vhost)}

    running = cli_process("topology", "retire", "--yes")
    assert running.returncode == 1 and "kept orders:test.ping" in running.stdout, running.stdout + running.stderr
    assert "nothing deleted" in running.stderr and "orders:test.ping" in queues()
    process.stop()
    holding = cli_process("topology", "retire", "--yes")
    assert holding.returncode == 1 and "kept orders.archive" in holding.stdout, holding.stdout + holding.stderr
    assert "orders.archive" in queues()
    retired = cli_process("topology", "retire", "--yes", "--discard")
    assert retired.returncode == 0, retired.stdout + retired.stderr
    assert "deleted orders.direct" in retired.stdout and "deleted orders.dead-letter" in retired.stdout
    for gone in ("orders:test.ping", "orders.archive"):  # asked of the broker itself (the management API may lag)
        with pytest.raises(TopologyMissing):
            producer.transport.count(gone)
    # Another service's queue stays, as does what is shared: the broker counts them (a deleted one would raise
    # TopologyMissing), and they are as they were: shipping's copy of the event fired waits (no worker reads it).
    assert producer.transport.count("shipping:test.ping") == 1
    assert producer.transport.count("amqp_events.delay.00") == 0


@pytest.mark.line_dependent("users and permissions")
def test_permissions_apply_creates_the_user_then_sets_a_new_password_or_says_it_kept_it(cli_process, rabbitmq, vhost):
    if rabbitmq.node is None:
        pytest.skip("deleting users needs the harness's own node (rabbitmqctl)")
    user = f"orders-{os.getpid()}-{time.monotonic_ns() % 10**6}"

    def apply(password: str | None) -> str:
        env = {"ORDERS_PASSWORD": password} if password else {}
        argv = [
            "topology",
            "permissions",
            "--user",
            user,
            "--apply",
            *(["--password-env", "ORDERS_PASSWORD"] * bool(env)),
        ]
        done = cli_process(*argv, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def logs_in(password: str) -> bool:
        try:
            with Connection(rabbitmq.vhost_url(vhost).replace("guest:guest", f"{user}:{password}")) as connection:
                connection.connect()
        except Exception:
            return False
        return True

    try:
        assert apply("first") == f"created user {user!r}; its permissions on vhost {vhost!r} given"
        assert logs_in("first")
        assert apply("second") == f"updated user {user!r}: its password set; its permissions on vhost {vhost!r} given"
        assert logs_in("second") and not logs_in("first")
        kept = apply(None)
        assert (
            kept
            == f"updated user {user!r} (its password unchanged: none given); its permissions on vhost {vhost!r} given"
        )
        assert logs_in("second")
    finally:
        rabbitmq.node.rabbitmqctl("delete_user", user)
