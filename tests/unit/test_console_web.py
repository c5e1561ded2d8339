"""The console's web layer without a broker: requests made straight to its ASGI application, as uvicorn makes them
(``path`` decoded whole, ``raw_path`` as sent), against a fleet that only remembers what it was asked."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, unquote

import pytest

from amqp_events.archive import Selection
from amqp_events.console import security
from amqp_events.console.security import Access, hash_password
from amqp_events.console.web import console_app

ANN = hash_password("ann-secret", rounds=1000)
#: A browser's CSRF cookie and the header a page of the console sends back with a change.
CSRF = {"Cookie": "csrf=t", "X-CSRF-Token": "t"}
HOSTILE_ID = "../../billing/archive/victim-1"


class FakeFleet:
    """What the API asks of a fleet, remembered; each answer as simple as it can be."""

    def __init__(self) -> None:
        self.app = SimpleNamespace(context=SimpleNamespace(transport=SimpleNamespace(errors=())))
        self.asked: list[tuple[Any, ...]] = []

    def archived(self, service: str, selection: Selection) -> list[Any]:
        self.asked.append(("archived", service, sorted(selection.ids)))
        return []

    def replay(self, service: str, selection: Selection, by: str, target: str = "") -> dict[str, list[str]]:
        self.asked.append(("replay", service, sorted(selection.ids)))
        return {"replayed": sorted(selection.ids), "unroutable": []}

    def retry_edited(self, service: str, message_id: str, args: list[Any], kwargs: dict[str, Any], by: str) -> bool:
        self.asked.append(("retry", service, message_id))
        return True

    def services(self) -> list[Any]:
        raise RuntimeError("a bug")


@dataclass
class Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)


async def asking(
    app: Any, method: str, target: str, headers: dict[str, str] | None = None, body: bytes = b"", client: str = ""
) -> Answer:
    """``app``'s answer to ``method target`` (``target`` as a client sends it: the path percent-encoded)."""
    raw_path, _, query = target.partition("?")
    sent = {"host": "127.0.0.1:8000", **{name.lower(): value for name, value in (headers or {}).items()}}
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": unquote(raw_path), "raw_path": raw_path.encode(), "query_string": query.encode(), "root_path": "",
        "headers": [(name.encode(), value.encode()) for name, value in sent.items()],
        "client": (client or "127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip
    bodies = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if bodies:
            return bodies.pop()
        await asyncio.get_running_loop().create_future()  # the client stays connected until the answer is sent
        raise AssertionError("unreachable")

    answer = Answer()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
            answer.headers = {name.decode().lower(): value.decode() for name, value in message["headers"]}
        else:
            answer.body += message.get("body", b"")

    try:
        await app(scope, receive, send)
    except Exception:
        if not answer.status:  # Starlette raises a handled exception again, after its 500 is sent, for the log
            raise
    return answer


def ask(app: Any, method: str, target: str, **options: Any) -> Answer:
    return asyncio.run(asking(app, method, target, **options))


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_guesses_sent_at_once_are_checked_no_more_than_the_limit_and_the_operator_s_token_still_gets_in(monkeypatch):
    checked: list[str] = []
    release = threading.Event()

    def held_check(password: str, password_hash: str) -> bool:  # PBKDF2's place: each check waits to be released
        checked.append(password)
        release.wait(30)
        return False

    monkeypatch.setattr(security, "password_matches", held_check)
    access = Access(users={"ann": ("operator", ANN)}, tokens={"op-token": "operator"})
    app = console_app(FakeFleet(), access)
    guesser = "10.0.0.9"

    def login(authorization: str, client: str = guesser) -> Any:
        return asking(app, "GET", "/nowhere", {"Authorization": authorization}, client=client)

    def status(authorization: str, client: str = guesser) -> int:
        return asyncio.run(login(authorization, client)).status

    async def sixty_guesses_at_once() -> list[int]:
        guesses = [asyncio.ensure_future(login(basic("ann", f"guess {n}"))) for n in range(60)]
        refused = []
        try:
            # Those refused are answered at once; those being checked are held until then.
            for answered in asyncio.as_completed(guesses, timeout=10):
                refused.append((await answered).status)
                if len(refused) == 50:
                    break
        finally:
            release.set()
        assert refused == [429] * 50
        return [(await guess).status for guess in guesses]

    assert sorted(asyncio.run(sixty_guesses_at_once())) == [401] * 10 + [429] * 50
    assert len(checked) == 10  # the limit, concurrent or not
    assert status(basic("ann", "ann-secret")) == 429  # even the right password, for a minute
    # The operator's script on the same address still gets in (404: let in, to a page that does not exist).
    assert status("Bearer op-token") == 404
    assert status("Bearer guess") == 429 and status("Bearer guess", client="10.0.0.8") == 401


def test_wrong_tokens_count_as_failed_logins():
    app = console_app(FakeFleet(), Access(tokens={"op-token": "operator"}))
    statuses = [
        ask(app, "GET", "/nowhere", headers={"Authorization": f"Bearer guess-{n}"}, client="10.0.0.7").status
        for n in range(11)
    ]
    assert statuses == [401] * 10 + [429]


def test_only_a_bearer_token_the_console_accepted_skips_the_csrf_check():
    replay = "/api/services/orders/archive/replay"
    body = json.dumps({"ids": ["e1"]}).encode()
    unconfigured = FakeFleet()
    app = console_app(unconfigured, Access())  # on loopback: everyone is an operator
    answer = ask(app, "POST", replay, headers={"Authorization": "Bearer xyz"}, body=body)
    assert answer.status == 403 and "CSRF" in answer.json()["error"] and unconfigured.asked == []
    assert ask(app, "POST", replay, headers={"Authorization": "Bearer xyz", **CSRF}, body=body).status == 200

    configured = FakeFleet()
    app = console_app(configured, Access(tokens={"op-token": "operator"}))
    assert ask(app, "POST", replay, headers={"Authorization": "Bearer op-token"}, body=body).status == 200
    assert configured.asked == [("replay", "orders", ["e1"])]


@pytest.mark.parametrize("message_id", [HOSTILE_ID, "a/b", "x/retry", "..%2F", "?#%", "e1"])
def test_an_id_is_one_segment_of_the_path_as_sent_whatever_it_holds(message_id):
    fleet = FakeFleet()
    app = console_app(fleet, Access())
    segment = quote(message_id, safe="")
    assert ask(app, "GET", f"/api/services/orders/archive/{segment}").status == 404  # asked, and not found
    edited = json.dumps({"args": [], "kwargs": {}}).encode()
    answer = ask(app, "POST", f"/api/services/orders/archive/{segment}/retry", headers=CSRF, body=edited)
    assert (answer.status, answer.json()) == (200, {"retried": message_id})
    assert fleet.asked == [("archived", "orders", [message_id]), ("retry", "orders", message_id)]
    # Its segments sent apart are not that id (a browser's ``..`` resolved, say): another path, nothing done.
    assert ask(app, "POST", "/api/services/orders/archive/a/b/retry", headers=CSRF, body=edited).status == 404
    assert len(fleet.asked) == 2


def test_every_answer_forbids_framing_sniffing_and_scripts_from_elsewhere():
    app = console_app(FakeFleet(), Access(tokens={"op-token": "operator"}), ["127.0.0.1"])
    bearer = {"Authorization": "Bearer op-token"}
    answers = {
        "401": ask(app, "GET", "/"),
        "404 page": ask(app, "GET", "/nowhere", headers=bearer),
        "404 API": ask(app, "GET", "/api/nowhere", headers=bearer),
        "500": ask(app, "GET", "/api/services", headers=bearer),
        "static": ask(app, "GET", "/static/console.js", headers=bearer),
        "another host": ask(app, "GET", "/", headers={"Host": "evil.example"}),
    }
    assert [answer.status for answer in answers.values()] == [401, 404, 404, 500, 200, 400]
    for name, answer in answers.items():
        policy = answer.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy, name
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, name
        assert answer.headers.get("x-frame-options") == "DENY", name
        assert answer.headers.get("x-content-type-options") == "nosniff", name
        assert answer.headers.get("referrer-policy") in ("same-origin", "no-referrer"), name


@pytest.mark.parametrize("depth", [50_000, 100_000])
def test_an_edit_nested_too_deep_is_a_clear_400(depth):
    fleet = FakeFleet()
    app = console_app(fleet, Access())
    deep = b'{"args": [' + b"[" * depth + b"]" * depth + b'], "kwargs": {}}'
    answer = ask(app, "POST", "/api/services/orders/archive/e1/retry", headers=CSRF, body=deep)
    assert answer.status == 400 and "nested too deep" in answer.json()["error"] and fleet.asked == []
    deep_replay = b'{"ids": [' + b"[" * depth + b"]" * depth + b"]}"
    assert ask(app, "POST", "/api/services/orders/archive/replay", headers=CSRF, body=deep_replay).status == 400


@pytest.mark.parametrize("target", ["//evil.example/x", "///evil.example", "/\\evil.example/x", "/%2F%2Fevil.example"])
def test_the_error_page_links_back_to_the_console_only(target):
    app = console_app(FakeFleet(), Access())
    answer = ask(app, "GET", target)
    [again] = re.findall(r'<a href="([^"]*)">Try again</a>', answer.body.decode())
    assert answer.status == 404 and again.startswith("/") and again[1:2] not in ("/", "\\"), again
