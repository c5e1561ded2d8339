"""MkDocs hooks: the reference pages' tables made from the code, so that they cannot drift from it.

A page asks for one with a marker on a line of its own: ``<!-- generated: settings -->`` (every
``amqp_events_*`` setting: its type, default and meaning, from :class:`amqp_events.settings.Settings`),
``<!-- generated: cli -->`` (every ``amqp-events`` command's ``--help``).

The docstrings' Sphinx roles (``:class:`~amqp_events.Reason```) are shown as code, as Sphinx would.

Pages that include a file of the repository's root (``BENCHMARKS.md``) keep its links: the files it links to
outside ``docs/`` are added to the site at the same path (:data:`ROOT_FILES`).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import click
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
#: Files outside ``docs/`` that an included page links to, by their path from the root.
ROOT_FILES = ("bench/chart.png",)

#: A Sphinx role left in a docstring (``:class:`~amqp_events.Reason```), as the API page renders it.
SPHINX_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc):<code>(~?)([^<]*)</code>")
#: Defaults written as factories, shown as the values they make.
EMPTY = {"field(default_factory=dict)": "{}"}
FIELD = re.compile(r"^    (?P<name>\w+): (?P<type>[^=]+?) = (?P<default>.+)$")


def on_files(files: Files, config: Any) -> Files:
    for path in ROOT_FILES:
        files.append(File.generated(config, path, abs_src_path=str(ROOT / path)))
    return files


def on_page_markdown(markdown: str, **_: Any) -> str:
    return markdown.replace("<!-- generated: settings -->", settings_table()).replace(
        "<!-- generated: cli -->", cli_reference()
    )


def on_page_content(html: str, **_: Any) -> str:
    """The docstrings use Sphinx's roles; the site shows their targets as code (``~`` keeps the last name)."""
    return SPHINX_ROLE.sub(lambda role: f"<code>{role[2].rsplit('.', 1)[-1] if role[1] else role[2]}</code>", html)


def settings_table() -> str:
    """One row per field of ``Settings``, its ``#:`` comment as the meaning."""
    from amqp_events import settings

    source = inspect.getsource(settings.Settings).splitlines()
    rows, comment = [], []
    for line in source:
        stripped = line.strip()
        if stripped.startswith("#:"):
            comment.append(stripped[2:].strip())
            continue
        field = FIELD.match(line)
        if field:
            default, kind = (field[part].strip().replace("|", "\\|") for part in ("default", "type"))
            default = EMPTY.get(default, default)
            rows.append(
                f"| `{settings.SETTING_PREFIX}{field['name']}` | `{kind}` | `{default}` | {' '.join(comment)} |"
            )
        comment = []
    from amqp_events.environment import VARIABLES

    environment = "".join(f"| `{name}` | {meaning} |\n" for name, meaning in VARIABLES.items())
    return (
        "| setting | type | default | meaning |\n|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n\nEvery environment variable the library reads (an app reads its settings' when it is made):\n\n"
        + "| variable | gives |\n|---|---|\n"
        + environment
    )


def cli_reference() -> str:
    """Every command's ``--help``, group by group."""
    from amqp_events.cli import main

    parts: list[str] = []
    _describe(main, "amqp-events", parts)
    return "\n".join(parts)


def _describe(command: click.Command, path: str, parts: list[str]) -> None:
    context = click.Context(command, info_name=path)
    parts.append(f"### `{path}`\n\n```\n{command.get_help(context)}\n```\n")
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            _describe(command.commands[name], f"{path} {name}", parts)
