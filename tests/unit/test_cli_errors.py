"""What the command line says when the app it is given cannot serve, through the installed ``amqp-events``: one
line on stderr that names the user's mistake, and a non-zero status (no broker: the app is checked first)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

AMQP_EVENTS = str(Path(sys.executable).parent / "amqp-events")
#: A port nothing listens on: a command that reached the broker would fail otherwise than the tests expect.
NOWHERE = "amqp://guest:guest@127.0.0.1:9//"
#: What the tests run with (the checkout, when the package is not installed from it).
PYTHONPATH = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]


def typed(tmp_path: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AMQP_EVENTS, *words],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": os.pathsep.join([str(tmp_path), *PYTHONPATH]), "PATH": "/usr/bin:/bin"},
    )


def write(tmp_path: Path, name: str, code: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))


def test_a_second_handler_for_an_event_is_one_line_naming_the_event(tmp_path):
    write(
        tmp_path,
        "twice",
        f"""
        from amqp_events.celery import events_app

        app = events_app("mailer", broker_url="{NOWHERE}")

        @app.handler("accounts.signed_up")
        def welcome(user_id: int): ...

        @app.handler("accounts.signed_up")
        def welcome_again(user_id: int): ...
    """,
    )
    done = typed(tmp_path, "-A", "twice", "limits", "show")
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "cannot load app 'twice'" in done.stderr and "accounts.signed_up" in done.stderr


def test_a_handler_name_that_matches_none_lists_the_handlers_that_take_a_limit(tmp_path):
    write(
        tmp_path,
        "mailer",
        f"""
        from amqp_events.celery import events_app

        app = events_app("notifications", broker_url="{NOWHERE}")

        @app.handler("accounts.signed_up", rate_limit="10/m")
        def send_welcome(user_id: int): ...

        @app.handler("accounts.export_requested")
        def export(user_id: int): ...
    """,
    )
    done = typed(tmp_path, "-A", "mailer", "limits", "set", "nosuch", "--rate-limit", "5/m")
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("Error: no handler is called 'nosuch'; ")
    assert "those with a limit in their code: send_welcome (accounts.signed_up)" in done.stderr
    assert "'notifications'" not in done.stderr and "export" not in done.stderr
