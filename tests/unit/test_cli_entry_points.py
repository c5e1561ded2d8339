"""Every command of ``amqp-events`` runs in at least one test through the installed entry point, not by importing
its implementation: adding a command without such a test fails here (no broker)."""

from __future__ import annotations

import ast
import re

import click
from helpers import TESTS

from amqp_events.cli import main

#: What runs the installed ``amqp-events`` in a test's source: the ``cli_process`` fixture, or its path.
#: (The guides tier runs a page's line from the page's virtualenv: ``guide.run(guide.line("amqp-events ...``.)
ENTRY_POINT = re.compile(r"(cli_process\(|AMQP_EVENTS, |/ \"amqp-events\"\)|run\(\w+\.line\(\"amqp-events )")
#: Commands a test runs with words it does not spell out: as a page prints them, or through a helper of the test
#: that runs the entry point with its arguments (what must be in that test module's source to show it).
SPELLED_ELSEWHERE = {
    ("outbox", "init"): ("docs/guides/test_pages_with_extras.py", 'line("amqp-events -A shop.celery outbox init")'),
    ("broker", "ctl"): ("docs/guides/test_core_pages.py", 'line("amqp-events broker ctl list_users")'),
    ("limits", "show"): ("broker/test_flow_control.py", 'limits(broker_url, "show"'),
    ("limits", "set"): ("broker/test_flow_control.py", 'limits(broker_url, "set", "send", "--reset"'),
    **{
        ("broker", word): ("cluster/test_cluster.py", f'run("{word}"')
        for word in ("kill", "restart", "partition", "heal")
    },
}


def commands(command: click.Command = main, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command line's words (``("archive", "list")``), a group that runs by itself included."""
    if not isinstance(command, click.Group):
        return [path]
    found = [path] if path and command.invoke_without_command else []
    for name, sub in sorted(command.commands.items()):
        found.extend(commands(sub, (*path, name)))
    return found


def sources() -> dict[str, str]:
    """The source of every function of the test suite (tests, fixtures, helpers), by ``file::name``."""
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                found[f"{path.relative_to(TESTS)}::{node.name}"] = ast.get_source_segment(text, node) or ""
    return found


def runs(command: tuple[str, ...], source: str) -> bool:
    """Does ``source`` run ``command`` through the entry point (its words right after the command's path)?"""
    words = ", ".join(f'"{word}"' for word in command)
    return any(words in source[found.end() : found.end() + 300] for found in ENTRY_POINT.finditer(source))


def test_every_command_runs_through_the_installed_entry_point_in_some_test():
    found = sources()
    missing = []
    for command in commands():
        if command in SPELLED_ELSEWHERE:
            module, evidence = SPELLED_ELSEWHERE[command]
            text = (TESTS / module).read_text()
            assert evidence in text and ENTRY_POINT.search(text), command
        elif not any(runs(command, source) for source in found.values()):
            missing.append(" ".join(command))
    assert missing == []
