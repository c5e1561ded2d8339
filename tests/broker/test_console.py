"""The operator console in a real headless browser (Debian's chromium, driven by Playwright), against a real
broker and real workers; its JSON API and its security model over plain HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.error
import urllib.request
from urllib.parse import quote, unquote

import pytest
from console_helpers import Console, call
from helpers import AMQP_EVENTS, ROOT, TESTS, effects_tables, queue_state, wait_archived
from kombu import Connection

from amqp_events.console.security import hash_password
from amqp_events.local.processes import free_port
from amqp_events.testing import wait_for

pytestmark = pytest.mark.broker
#: Where the console guide's screenshots are written (checked in).
SCREENSHOTS = ROOT / "docs" / "console"
PING = "orders:test.ping"
#: A browser's CSRF cookie and the header a page of the console sends back with a change.
CSRF = {"Cookie": "csrf=t", "X-CSRF-Token": "t"}


def status_of(url: str, body: object, headers: dict[str, str]) -> int:
    """The status of a request whose answer may not be JSON."""
    try:
        return call(url, body, headers)[0]
    except json.JSONDecodeError:
        request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return error.code


def outcome(page, starting: str = "") -> str:
    """What the page says an action it sent came to, once it says that (a page reloads a moment after a
    change, and until then shows the outcome of the previous action)."""

    def told() -> str:
        text: str = page.locator("#outcome").inner_text()
        return text if text.startswith(starting) else ""

    return wait_for(told, 10, what=f"the page telling an outcome {starting!r}")


@pytest.mark.line_dependent("the archive through the management API")
def test_an_archived_event_is_shown_with_its_traceback_and_after_the_fix_a_click_replays_it(
    worker, producer, records, archive_of, console, browser
):
    failing = worker("orders")
    event_id = producer.fire("test.ping", ["c1"], {"how": {"permanent": True}})
    wait_archived(archive_of("orders"), 1)
    page = browser.new_page(viewport={"width": 1280, "height": 900})

    page.goto(console.url + "/")
    row = page.locator("tr.service[data-service='orders']")
    # Live: the figures follow without a reload.
    wait_for(lambda: row.locator("td.workers").inner_text() == "1", 40, what="the worker shown (its heartbeats)")
    # The broker's queue figures lag its queues by a statistics interval.
    wait_for(lambda: row.locator("td.archived").inner_text() == "1", 30, what="the archived event counted")
    assert "1 archived in 1 group(s)" in row.locator("td.state").inner_text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "overview.png", full_page=True)

    page.click("text=orders >> nth=0")
    row = page.locator(f"tr.message[data-id='{event_id}']")
    cells = row.locator("td")
    assert event_id[:12] in cells.nth(1).inner_text()  # its id
    assert '"[0]":"c1"' in cells.nth(3).inner_text().replace(" ", "")  # arguments, by name
    row.locator("summary").click()
    assert "PermanentFailure: c1 can never succeed" in row.inner_text()
    assert "Traceback (most recent call last)" in row.locator("pre.traceback").inner_text()
    page.screenshot(path=SCREENSHOTS / "archive.png", full_page=True)

    failing.stop()
    worker("orders", env={"FIXED": "1"})  # the fix is deployed
    row.locator("input.pick").check()
    page.click("#replay-selected")
    assert outcome(page, "done: ")
    page.wait_for_load_state()
    wait_for(lambda: page.locator(f"tr.message[data-id='{event_id}']").count() == 0, 10, what="the row gone")
    records.wait(2)  # the failed run, then the replayed one, this time done
    assert [run["tag"] for run in records.all(id=event_id)] == ["c1", "c1"]
    assert archive_of("orders").list() == []


@pytest.mark.line_dependent("purging through the management API")
def test_a_purge_needs_the_service_s_name_typed(worker, producer, archive_of, console, browser):
    worker("orders")
    event_id = producer.fire("test.ping", ["p1"], {"how": {"permanent": True}})
    wait_archived(archive_of("orders"), 1)
    indexed = console.url + "/api/services/orders/groups"  # the pages list what the console's index read
    wait_for(lambda: call(indexed)[1]["archived"] == 1, 30, what="the console's index reading the archive")
    page = browser.new_page()
    page.goto(f"{console.url}/services/orders/archive")
    # Its reason's name is explained where it is shown, and every reason on the page's own list.
    reason = page.locator(f"tr.message[data-id='{event_id}'] abbr")
    assert reason.inner_text() == "non_retryable" and "no retry can mend" in (reason.get_attribute("title") or "")
    page.click("details.reasons summary")
    assert "the broker verified as its author" in page.locator("details.reasons").inner_text()
    page.locator(f"tr.message[data-id='{event_id}'] input.pick").check()
    answers = iter([None, "yes", "orders"])  # dismissed, then a wrong name, then the right one

    def on_prompt(dialog) -> None:
        answer = next(answers)
        dialog.dismiss() if answer is None else dialog.accept(answer)

    page.on("dialog", on_prompt)
    page.click("#purge-selected")
    page.click("#purge-selected")
    assert "confirm it with the service's name" in outcome(page, "refused: ")
    assert archive_of("orders").count() == 1
    page.click("#purge-selected")
    assert json.loads(outcome(page, "done: ").removeprefix("done: ")) == {"purged": [event_id]}
    wait_for(lambda: archive_of("orders").count() == 0, 10, what="the message purged")


@pytest.mark.line_dependent("consumers cancelled and resumed by remote control")
def test_pausing_a_handler_stops_its_consumption_on_every_worker(worker, producer, records, console, browser):
    worker("orders")
    worker("orders", pool="threads", concurrency=2)
    wait_for(lambda: queue_state(producer, PING)[1] == 2, 30, what="both workers consuming")
    page = browser.new_page()
    page.goto(f"{console.url}/services/orders/archive")
    offered = page.eval_on_selector_all("#handler-names option", "options => options.map(o => o.value)")
    assert "test.ping" in offered, offered  # the form offers the service's handlers
    page.fill("#handler", "on_ping")
    page.click("#pause")
    assert len(json.loads(outcome(page, "done: ").removeprefix("done: "))["workers"]) == 2
    assert queue_state(producer, PING)[1] == 0  # each worker cancelled its consumer before it answered
    producer.fire("test.ping", ["while paused"], {})  # confirmed: in the queue, which nobody consumes
    assert queue_state(producer, PING) == (1, 0) and records.all() == []
    overview = browser.new_page()

    def breakers_shown() -> int:
        overview.goto(console.url + "/services/orders/archive")
        workers = overview.locator("table.workers")
        return workers.inner_text().count("services.orders.on_ping: open") if workers.count() else 0

    wait_for(lambda: breakers_shown() == 2, 40, what="the overview showing the breaker open in both workers")
    page.click("#resume")
    records.wait(1)


def test_with_a_service_s_app_the_overview_shows_the_versions_of_its_events_and_whom_each_reaches(
    worker, broker_url, rabbitmq, browser
):
    worker("invoices")
    worker("shipping")
    console = Console(broker_url, rabbitmq.management.base_url, f"127.0.0.1:{free_port()}",
                      {"PYTHONPATH": str(TESTS), "BROKER_URL": broker_url}, app="services.invoices")  # fmt: skip
    try:
        console.wait_serving(console.url + "/api/services")
        page = browser.new_page()
        page.goto(console.url + "/")
        paid = page.locator('#events tr[data-event="billing.invoice.paid"]')
        assert paid.locator(".taken").inner_text() == "2"  # its upcaster takes version 1
        assert paid.locator(".fired").inner_text() == ""  # it does not fire it
        assert paid.locator(".subscribers").inner_text() == "invoices"
        assert page.locator('#events tr[data-event="test.ping"] .subscribers').inner_text() == "shipping"
    finally:
        console.stop()


def test_with_a_service_s_app_the_overview_shows_its_inbox(
    worker, producer, records, broker_url, rabbitmq, tmp_path, browser
):
    database = f"sqlite:///{tmp_path / 'payments.db'}"
    env = {"DATABASE_URL": database}
    with effects_tables(database):
        pass  # the tables stay in the file
    worker("payments", env=env)
    producer.fire("pay.connection", ["t1"], {})
    records.wait(1)
    console = Console(broker_url, rabbitmq.management.base_url, f"127.0.0.1:{free_port()}",
                      {**env, "PYTHONPATH": str(TESTS), "BROKER_URL": broker_url}, app="services.payments")  # fmt: skip
    try:
        console.wait_serving(console.url + "/api/services")
        page = browser.new_page()
        page.goto(console.url + "/")
        assert page.locator(".inbox").inner_text() == f"inbox amqp_events_inbox ({database}): 1 key(s)"
        assert "outbox: none configured" in page.locator(".databases").inner_text()
    finally:
        console.stop()


def test_the_api_answers_bad_input_with_a_clear_4xx(worker, console):
    worker("orders")
    assert call(console.url + "/api/services/nobody/archive") == (
        404,
        {"error": "no service 'nobody' on this vhost (none has a queue nobody.archive)"},
    )
    status, answer = call(console.url + "/api/services/orders/archive?limit=many")
    assert status == 400 and "limit" in answer["error"]
    status, answer = call(console.url + "/api/services/orders/archive?since=soon")
    assert status == 400 and answer["error"].startswith("since: 'soon' is neither an ISO-8601 time")
    status, answer = call(console.url + "/api/services/orders/archive?reason=bored")
    assert status == 400 and "reason: one of" in answer["error"]
    assert call(console.url + "/api/services/orders/archive/no-such-id")[0] == 404
    status, answer = call(console.url + "/api/services/orders/archive/replay", [1, 2], CSRF)
    assert status == 400 and "not a JSON object" in answer["error"]
    status, answer = call(console.url + "/api/services/orders/archive/replay", {}, CSRF)
    assert status == 400 and "choose what to replay" in answer["error"]


@pytest.mark.line_dependent("user_id validation of a replay")
def test_a_replay_through_the_api_is_stamped_with_who_made_it(worker, producer, archive_of, console):
    worker("orders")
    producer.fire("test.ping", ["again"], {"how": {"permanent": True}})
    [archived] = wait_archived(archive_of("orders"), 1)
    assert "replayed_by" not in archived.headers
    listing = console.url + "/api/services/orders/archive?since="
    assert [m["id"] for m in call(listing + "1h")[1]["messages"]] == [archived.id]
    assert call(listing + "2099-01-01T00:00:00")[1]["messages"] == []
    status, answer = call(f"{console.url}/api/services/orders/archive/replay", {"ids": [archived.id]}, CSRF)
    assert (status, answer) == (200, {"replayed": [archived.id], "unroutable": []})
    [again] = wait_for(lambda: archive_of("orders").list(), 30, what="archived again (the fix is not out)")
    assert again.headers["replayed_by"] == "local@console(127.0.0.1)"


def test_a_broker_that_cannot_be_reached_is_a_503_not_a_traceback():
    nowhere = free_port()
    down = Console(
        f"amqp://guest:guest@127.0.0.1:{nowhere}//", f"http://127.0.0.1:{nowhere}", f"127.0.0.1:{free_port()}"
    )
    try:
        down.wait_serving(down.url + "/api/services")
        status, answer = call(down.url + "/api/services")
        assert status == 503 and "cannot reach the management API" in answer["error"], answer
        assert "--management-url or AMQP_EVENTS_MANAGEMENT_URL" in answer["error"]
        try:  # a page says it in a page, not in raw JSON
            urllib.request.urlopen(down.url + "/", timeout=30)
        except urllib.error.HTTPError as error:
            page = (error.code, error.headers["content-type"], error.read().decode())
        assert page[:2] == (503, "text/html; charset=utf-8") and "cannot reach the management API" in page[2]
        assert '{"error"' not in page[2]
        status, answer = call(down.url + "/api/services/orders/archive/replay", {"ids": ["x"]}, CSRF)
        assert status == 503
    finally:
        down.stop()


def test_a_change_without_the_csrf_token_changes_nothing(worker, producer, archive_of, console):
    worker("orders")
    producer.fire("test.ping", ["kept"], {"how": {"permanent": True}})
    [archived] = wait_archived(archive_of("orders"), 1)
    replay = f"{console.url}/api/services/orders/archive/replay"
    for forged in ({}, {"Cookie": "csrf=abc"}, {"Cookie": "csrf=abc", "X-CSRF-Token": "xyz"}):
        status, answer = call(replay, {"ids": [archived.id]}, forged)
        assert status == 403 and "CSRF" in answer["error"]
    assert [message.id for message in archive_of("orders").list()] == [archived.id]


def an_address_off_loopback() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
        address = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this machine has no address off loopback")
    return address


def test_off_loopback_the_console_refuses_to_start_without_credentials_and_then_asks_for_them(
    worker, broker_url, rabbitmq
):
    worker("orders")
    address, management = an_address_off_loopback(), rabbitmq.management.base_url
    without = Console(broker_url, management, f"0.0.0.0:{free_port()}")
    assert without.process.wait(30) != 0
    assert "without authentication" in without.output()
    hashed = subprocess.run([AMQP_EVENTS, "console", "hash-password"], input="ann-secret\nann-secret\n",
                            capture_output=True, text=True, timeout=60)  # fmt: skip  # as an operator makes one
    assert hashed.returncode == 0, hashed.stderr
    users = f"ann:read:{hashed.stdout.split()[-1]},bob:operator:{hash_password('bob', rounds=1000)}"
    port = free_port()
    env = {"AMQP_EVENTS_CONSOLE_USERS": users, "AMQP_EVENTS_CONSOLE_TOKEN": "scripts-token"}
    guarded = Console(broker_url, management, f"0.0.0.0:{port}", env)
    try:
        url = f"http://{address}:{port}/api/services"
        guarded.wait_serving(url)
        status, answer = call(url)
        assert status == 401 and answer == {"error": "authentication required"}
        status, _ = call(url, headers={"Authorization": "Basic " + _basic("ann", "wrong")})
        assert status == 401
        status, services = call(url, headers={"Authorization": "Basic " + _basic("ann", "ann-secret")})
        assert status == 200 and [service["name"] for service in services] == ["orders"]
        replay = f"http://{address}:{port}/api/services/orders/archive/replay"
        reader = {"Authorization": "Basic " + _basic("ann", "ann-secret"), **CSRF}
        status, answer = call(replay, {"ids": ["x"]}, reader)
        assert status == 403 and answer["error"] == "ann may only look (role read)"
        status, answer = call(replay, {"ids": ["x"]}, {"Authorization": "Bearer scripts-token"})
        assert (status, answer) == (404, {"error": "no archived message with the id(s) x"})  # it got that far
        assert (
            b"guest"
            not in urllib.request.urlopen(
                urllib.request.Request(url, headers={"Authorization": "Bearer scripts-token"})
            ).read()
        )  # the broker's credentials are never shown
    finally:
        guarded.stop()


def _basic(user: str, password: str) -> str:
    import base64

    return base64.b64encode(f"{user}:{password}".encode()).decode()


def test_a_request_for_another_host_name_is_refused_before_anything_else(worker, producer, archive_of, console):
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1 sends its own Host header."""
    worker("orders")
    producer.fire("test.ping", ["kept"], {"how": {"permanent": True}})
    [archived] = wait_archived(archive_of("orders"), 1)
    rebound = {"Host": "evil.example", **CSRF}
    purge = f"{console.url}/api/services/orders/archive/purge"
    assert status_of(purge, {"ids": [archived.id], "confirm": "orders"}, rebound) == 400
    assert status_of(console.url + "/api/services", None, {"Host": "evil.example"}) == 400
    assert [entry.id for entry in archive_of("orders").list()] == [archived.id]  # nothing purged
    assert call(console.url + "/api/services", headers={"Host": "localhost"})[0] == 200


def test_x_forwarded_for_is_not_believed_without_a_proxy(worker, producer, archive_of, console):
    worker("orders")
    producer.fire("test.ping", ["again"], {"how": {"permanent": True}})
    [archived] = wait_archived(archive_of("orders"), 1)
    forged = {"X-Forwarded-For": "6.6.6.6", **CSRF}
    status, _ = call(f"{console.url}/api/services/orders/archive/replay", {"ids": [archived.id]}, forged)
    assert status == 200
    [again] = wait_for(lambda: archive_of("orders").list(), 30, what="archived again (the fix is not out)")
    assert again.headers["replayed_by"] == "local@console(127.0.0.1)"


def test_failed_logins_are_throttled_and_checked_off_the_event_loop(broker_url, rabbitmq):
    from concurrent.futures import ThreadPoolExecutor, as_completed

    users = f"ann:operator:{hash_password('ann-secret')}"  # the real cost: a fraction of a second each
    env = {"AMQP_EVENTS_CONSOLE_USERS": users, "AMQP_EVENTS_CONSOLE_TOKEN": "scripts-token"}
    guarded = Console(broker_url, rabbitmq.management.base_url, f"127.0.0.1:{free_port()}", env)
    url = guarded.url + "/api/services"
    try:
        guarded.wait_serving(url)
        wrong = {"Authorization": "Basic " + _basic("ann", "guess")}
        nobody = {"Authorization": "Basic " + _basic("nobody", "guess")}
        with ThreadPoolExecutor(12) as pool:
            guesses = [pool.submit(call, url, None, wrong if n % 2 else nobody) for n in range(10)]
            token = pool.submit(call, url, None, {"Authorization": "Bearer scripts-token"})
            finished = [future for future in as_completed([*guesses, token], timeout=120)]
        # The token's request did not wait behind the ten password checks.
        assert finished.index(token) < len(finished) - 1 and token.result()[0] == 200
        assert sorted(future.result()[0] for future in guesses) == [401] * 10
        status, answer = call(url, headers={"Authorization": "Basic " + _basic("ann", "ann-secret")})
        assert status == 429 and "too many failed logins" in answer["error"]  # even the right one, for a minute
    finally:
        guarded.stop()


def entry_of(path: str) -> tuple[str, str]:
    """The service and the archived message a path of the API names (each one segment, as the console reads it)."""
    _, api, services, service, archive, message_id, *rest = path.split("/")
    assert (api, services, archive) == ("api", "services", "archive") and rest in ([], ["retry"]), path
    return service, unquote(message_id)


def test_an_archived_id_with_slashes_and_dots_names_that_entry_of_its_service_alone(
    worker, producer, records, archive_of, service_app, broker_url, console, browser
):
    """An id is data: ``../../shipping/archive/victim-1`` archived by orders is not shipping's ``victim-1``, in the
    pages' links as the browser resolves them nor in the API; the pages run under their CSP without a violation."""
    worker("orders")
    service_app("shipping").declare_topology()
    with Connection(broker_url) as connection:  # the victim, put straight into shipping's archive
        channel = connection.default_channel
        victim = {"id": "victim-1", "task": "test.ping", "archive_reason": "max_retries"}
        message = channel.prepare_message(
            b'[["victim"], {}, null]', content_type="application/json", content_encoding="utf-8", headers=victim
        )
        channel.basic_publish(message, exchange="", routing_key="shipping.archive")
    hostile = "../../shipping/archive/victim-1"
    producer.fire("test.ping", ["h1"], {"how": {"permanent": True}}, event_id=hostile)
    wait_archived(archive_of("orders"), 1)
    status, shown = call(f"{console.url}/api/services/orders/archive/{quote(hostile, safe='')}")
    assert status == 200 and shown["id"] == hostile
    [group] = wait_for(lambda: call(console.url + "/api/services/orders/groups")[1]["groups"], 30, what="indexed")

    page = browser.new_page()
    problems: list[object] = []
    page.on("pageerror", lambda error: problems.append(error))
    page.on("console", lambda message: "Content Security Policy" in message.text and problems.append(message.text))
    links: list[str] = []  # as the browser resolves them
    for path in ("/", "/audit", "/services/orders/archive", f"/services/orders/groups/{group['id']}"):
        answer = page.goto(console.url + path)
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
        links += page.eval_on_selector_all(
            "[data-url], [data-retry]",
            "found => found.flatMap(e => [e.dataset.url, e.dataset.retry])"
            ".filter(Boolean).map(link => new URL(link, location.href).pathname)",
        )
    assert [entry_of(link) for link in links] == [("orders", hostile)] * 3, links  # its details; edit, retry
    editor = page.locator("#edit textarea")
    page.click("tr.member button.edit")
    wait_for(lambda: '"h1"' in editor.input_value(), 10, what="its arguments in the editor")
    page.click("#edit button[data-close]")
    assert not page.locator("#edit").evaluate("dialog => dialog.open")
    page.click("tr.member button.edit")
    wait_for(lambda: page.locator("#edit").evaluate("dialog => dialog.open"), 10, what="the editor open again")
    editor.fill('{"args": ["h1 fixed"], "kwargs": {"how": {}}}')
    page.click("#send-edited")
    assert outcome(page, "done: ") == f'done: {{"retried":"{hostile}"}}'
    [run] = records.wait(1, tag="h1 fixed")
    assert run["id"] == hostile
    assert [entry.id for entry in archive_of("shipping").list()] == ["victim-1"]  # untouched
    assert problems == []


@pytest.mark.line_dependent("the limits' stream")
def test_an_operator_sets_a_handler_s_limits_on_its_page_and_every_worker_reads_them(
    worker, producer, records, console, browser, broker_url
):
    worker("mailer", env={"CONCURRENCY": "1"})
    worker("mailer", env={"CONCURRENCY": "1"})
    page = browser.new_page()
    page.goto(f"{console.url}/services/mailer/archive")
    assert "None set at run time" in page.locator("main").inner_text()
    page.fill("#limit-handler", "mail.send")
    page.fill("#limit-concurrency", "two")
    page.click("#set-limits")
    assert "whole number" in outcome(page, "refused: ")  # refused with its reason; nothing written
    page.fill("#limit-concurrency", "2")
    page.fill("#limit-rate", "")
    page.click("#set-limits")
    answer = json.loads(outcome(page, "done: ").removeprefix("done: "))
    assert answer == {"limits": {"mail.send": {"concurrency": 2, "rate_limit": None}}}
    wait_for(lambda: page.locator("table.limits").count() == 1, 10, what="the page showing the limits set")
    assert "mail.send 2 none" in " ".join(page.locator("table.limits").inner_text().split())
    # Both workers (which read the table as they count runs) run two at once now, not their code's one.
    for n in range(12):
        producer.fire("mail.send", [], {"n": n, "sleep": 1.0})
    runs = records.wait(24, 120, service="mailer", handler="send")
    spans = {}
    for line in runs:
        spans.setdefault(line["n"], []).append(line["time"])
    edges = sorted([(times[0], 1) for times in spans.values()] + [(times[1], -1) for times in spans.values()])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert most == 2
    status, audit = call(f"{console.url}/api/audit?service=mailer")
    assert status == 200 and [row["action"] for row in audit["records"]][:1] == ["set limits"]
    page.goto(f"{console.url}/audit?action=set+limits")  # the log says it keeps limit changes, and lists them
    assert "limits set and limits reset" in page.locator("p.muted").first.inner_text()
    assert "mail.send" in page.locator("#audit").inner_text()
    page.goto(f"{console.url}/services/mailer/archive")
    page.fill("#limit-handler", "mail.send")
    page.click("#reset-limits")
    assert json.loads(outcome(page, "done: ").removeprefix("done: ")) == {"limits": {}}
    assert call(f"{console.url}/api/services/mailer/limits/mail.nope", {"reset": True}, CSRF)[0] == 404


def test_clients_that_reset_their_connection_mid_response_leave_the_console_serving(console):
    """A browser that leaves a page while the console writes it resets the connection: the write fails with an
    error the server handles. The process ignores SIGPIPE, as a Python server does (the signal would end it)."""
    status = open(f"/proc/{console.process.pid}/status").read()  # noqa: SIM115
    ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    assert ignored & (1 << (13 - 1)), "SIGPIPE is not ignored"
    host, port = console.url.removeprefix("http://").split(":")
    for _ in range(20):
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
            client.sendall(f"GET /services HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert console.process.poll() is None, console.output()
    assert call(console.url + "/api/services")[0] in (200, 401)
