"""The console as an operator's first screen, in a real headless Chromium against a real broker and workers:
failures grouped by cause and replayed as a group after the fix, edit and retry, the event log, live figures."""

from __future__ import annotations

import pytest
from console_helpers import Console, call
from helpers import ROOT, TESTS, wait_archived

from amqp_events.archive import Selection
from amqp_events.local.processes import free_port
from amqp_events.testing import wait_for

pytestmark = pytest.mark.broker
SCREENSHOTS = ROOT / "docs" / "console"
CSRF = {"Cookie": "csrf=t", "X-CSRF-Token": "t"}
LAPTOP = {"width": 1400, "height": 1000}


def told(page, starting: str) -> str:
    """What the page says an action came to, once it says it."""
    return wait_for(
        lambda: (text := page.locator("#outcome").inner_text()).startswith(starting) and text,
        30,
        what=f"the page telling an outcome {starting!r}",
    )


def test_fifty_failures_of_one_cause_and_five_of_another_are_two_groups_and_the_group_replayed_after_the_fix_runs(
    worker, producer, records, archive_of, console, browser
):
    failing = worker("orders")
    page = browser.new_page(viewport=LAPTOP)
    errors: list[object] = []
    page.on("pageerror", lambda error: errors.append(error))
    page.goto(console.url + "/")
    row = page.locator("tr.service[data-service='orders']")
    wait_for(lambda: row.locator("td.workers").inner_text() == "1", 40, what="the worker shown (its heartbeats)")
    fired = [producer.fire("test.ping", [f"k{n}"], {"how": {"permanent": True}}) for n in range(50)]
    rejected = [producer.fire("test.ping", [f"r{n}"], {"how": {"reject": True}}) for n in range(5)]
    # Live: the overview, loaded before the failures, shows them without a reload.
    wait_for(lambda: row.locator("td.archived").inner_text() == "55", 60, what="the overview following the archive")
    assert "55 archived in 2 group(s)" in row.locator("td.state").inner_text()
    assert page.locator("#fleet-chart").inner_text() or page.locator("#fleet-chart .uplot").count() == 1
    page.screenshot(path=SCREENSHOTS / "overview.png", full_page=True)

    status, answer = call(console.url + "/api/services/orders/groups")
    assert status == 200 and answer["archived"] == 55
    groups = {group["exception"]: group for group in answer["groups"]}
    assert [group["count"] for group in answer["groups"]] == [50, 5]
    big = groups["amqp_events.errors.PermanentFailure"]
    assert big["message"] == "k<…> can never succeed" and big["handler"] == "services.orders.on_ping"
    assert big["first_seen"] <= big["last_seen"]
    members = call(f"{console.url}/api/services/orders/groups/{big['id']}")[1]["members"]
    assert sorted(member["id"] for member in members) == sorted(fired)
    assert {member["arguments"] for member in members} >= {'{"[0]": "k7", "how": {"permanent": true}}'}

    page.click("a[href='/services/orders/archive'] >> nth=0")
    page.wait_for_url("**/services/orders/archive", timeout=30_000)  # a click waits for the navigation's start only
    assert page.locator("tr.group").count() == 2
    assert page.locator("tr.group td.count").all_inner_texts() == ["50", "5"]
    page.click(f"tr.group[data-group='{big['id']}'] a")
    page.wait_for_url(f"**/services/orders/groups/{big['id']}", timeout=30_000)
    assert page.locator(".count").inner_text() == "50"
    assert page.locator("tr.member").count() == 50
    page.screenshot(path=SCREENSHOTS / "group.png")

    failing.stop()
    worker("orders", env={"FIXED": "1"})  # the fix is deployed
    page.click("#replay-group")
    assert told(page, "done: ").endswith('"unroutable":[]}')
    wait_for(lambda: archive_of("orders").count() == 5, 30, what="the group's 50 gone from the archive")
    records.wait(55 + 50)
    for event_id in fired:  # the failed run, then the replay: done
        assert len(records.all(id=event_id)) == 2
    assert sorted(message.id for message in archive_of("orders").list()) == sorted(rejected)
    status, answer = call(console.url + "/api/services/orders/groups")
    assert [group["count"] for group in answer["groups"]] == [5]
    assert errors == []  # no script of any page failed


def test_an_archived_message_s_arguments_are_edited_and_retried_once_they_fit_the_handler(
    worker, producer, records, archive_of, broker_url, rabbitmq, browser, tmp_path
):
    worker("orders")
    event_id = producer.fire("test.ping", ["e1"], {"how": {"permanent": True}})
    [archived] = wait_archived(archive_of("orders"), 1)
    audit_file = tmp_path / "audit.jsonl"
    env = {"PYTHONPATH": str(TESTS), "BROKER_URL": broker_url}
    bind = f"127.0.0.1:{free_port()}"
    options = ("--refresh", "0.5", "--audit-file", str(audit_file))
    console = Console(broker_url, rabbitmq.management.base_url, bind, env, "services.orders", options)
    try:
        console.wait_serving(console.url + "/api/services")
        retry = f"{console.url}/api/services/orders/archive/{event_id}/retry"
        status, answer = call(retry, {"args": ["e1"], "kwargs": {"colour": "red"}}, CSRF)
        assert status == 400 and "cannot take this payload" in answer["error"], answer  # the handler's signature
        assert call(retry, {"args": "e1"}, CSRF)[0] == 400

        page = browser.new_page(viewport=LAPTOP)
        [group] = wait_for(lambda: call(console.url + "/api/services/orders/groups")[1]["groups"], 30, what="indexed")
        page.goto(f"{console.url}/services/orders/groups/{group['id']}")
        page.click(f"tr.member[data-id='{event_id}'] button.edit")
        editor = page.locator("#edit textarea")
        wait_for(lambda: '"permanent": true' in editor.input_value(), 10, what="the arguments in the editor")
        editor.fill('{"args": ["e1"], "kwargs": {"how": {}, "colour": "red"}}')
        page.click("#send-edited")
        assert "cannot take this payload" in wait_for(
            lambda: page.locator("#edit .edit-error").inner_text(), 10, what="the refusal in the dialog"
        )
        assert archive_of("orders").count() == 1  # nothing was sent
        editor.fill('{"args": ["e1 fixed"], "kwargs": {"how": {}}}')
        page.click("#send-edited")
        assert told(page, "done: ") == f'done: {{"retried":"{event_id}"}}'
        [run] = records.wait(1, tag="e1 fixed")
        assert run["id"] == event_id and archive_of("orders").count() == 0
    finally:
        console.stop()

    # The event log keeps the original arguments, and outlives the console (the file).
    again = Console(broker_url, rabbitmq.management.base_url, bind, env, "", ("--audit-file", str(audit_file)))
    try:
        again.wait_serving(again.url + "/api/services")
        [edit] = call(again.url + "/api/audit?action=edit")[1]["records"]
        assert edit["who"] == "local@console(127.0.0.1)" and edit["target"] == f"message {event_id}"
        assert edit["detail"]["before"] == {"args": ["e1"], "kwargs": {"how": {"permanent": True}}}
        assert edit["detail"]["after"] == {"args": ["e1 fixed"], "kwargs": {"how": {}}}
        # Without the service's app, the console knows the arguments only from the archived message.
        producer.fire("test.ping", ["e2"], {"how": {"permanent": True}})
        [second] = wait_archived(archive_of("orders"), 1)
        status, answer = call(
            f"{again.url}/api/services/orders/archive/{second.id}/retry", {"args": [], "kwargs": {"tag": "x"}}, CSRF
        )
        assert status == 400 and "without the service's app" in answer["error"]
    finally:
        again.stop()
    assert archived.id == event_id


def test_the_event_log_shows_each_action_made_through_the_console(
    worker, producer, records, archive_of, console, browser
):
    worker("orders")
    kept = producer.fire("test.ping", ["a1"], {"how": {"permanent": True}})
    producer.fire("test.ping", ["a2"], {"how": {"reject": True}})
    wait_archived(archive_of("orders"), 2)
    api = console.url + "/api/services/orders"
    listed = wait_for(
        lambda: len(found := call(api + "/groups")[1]["groups"]) == 2 and found, 30, what="both groups indexed"
    )  # the index follows the archive within a refresh
    groups = {group["exception"]: group["id"] for group in listed}
    assert call(f"{api}/archive/replay", {"ids": [kept]}, CSRF)[0] == 200
    rejected_group = next(group for exception, group in groups.items() if "PermanentFailure" not in exception)
    assert call(f"{api}/groups/{rejected_group}/purge", {}, CSRF)[0] == 400  # not confirmed: nothing done
    assert call(f"{api}/groups/{rejected_group}/purge", {"confirm": "orders"}, CSRF)[0] == 200
    assert call(f"{api}/handlers/on_ping/pause", {}, CSRF)[0] == 200
    assert call(f"{api}/handlers/on_ping/resume", {}, CSRF)[0] == 200

    page = browser.new_page(viewport=LAPTOP)
    page.goto(console.url + "/audit")
    rows = page.locator("tr.record")
    assert [rows.nth(n).get_attribute("data-action") for n in range(rows.count())] == [
        "resume", "pause", "purge", "replay"
    ]  # fmt: skip
    assert f"group {rejected_group}" in page.locator("tr.record[data-action='purge']").inner_text()
    assert "local@console(127.0.0.1)" in rows.nth(0).inner_text()
    page.screenshot(path=SCREENSHOTS / "event-log.png", full_page=True)
    page.select_option("select[name=action]", "purge")  # then by keyboard alone: Tab to Filter, Enter
    page.focus("select[name=action]")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    wait_for(lambda: page.locator("tr.record").count() == 1, 10, what="the log filtered to the purge")
    assert call(console.url + "/api/audit?action=replay")[1]["records"][0]["detail"]["ids"] == [kept]


def test_what_another_tool_changes_in_an_archive_is_shown_within_a_refresh(worker, producer, archive_of, console):
    worker("orders")
    for n in range(3):
        producer.fire("test.ping", [f"o{n}"], {"how": {"permanent": True}})
    wait_archived(archive_of("orders"), 3)
    groups = console.url + "/api/services/orders/groups"
    wait_for(lambda: call(groups)[1]["archived"] == 3, 30, what="the three indexed")
    assert len(archive_of("orders").purge(Selection.of(limit=1))) == 1  # as `amqp-events archive purge` would
    wait_for(lambda: call(groups)[1]["archived"] == 2, 30, what="the purge seen by the console")
