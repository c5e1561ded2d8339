"""``amqp-events contracts check BASELINE CURRENT``: the changes to the fleet's event contracts, and which break a
consumer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from amqp_events.contracts.fleet import Contract, check, markdown, read

SUFFIXES = (".json", ".yaml", ".yml")


@click.group()
def contracts() -> None:
    """The fleet's event contracts, from the services' AsyncAPI documents (`amqp-events -A APP asyncapi`)."""


@contracts.command("check")
@click.argument("baseline", type=click.Path(exists=True, path_type=Path))
@click.argument("current", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--format", "output_format", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True
)
def contracts_check(baseline: Path, current: Path, output_format: str) -> None:
    """Compare the services' CURRENT documents with the BASELINE ones (each a directory of documents, one per
    service, or one document) and report every change: those that break a consumer (a handler would refuse an
    event fired now, or one fired before and still at rest; an event that services handle is fired by nobody
    any more) and those that break nobody. Exits 1 when a change breaks a consumer."""
    findings = check(contracts_in(baseline), contracts_in(current))
    if output_format == "json":
        click.echo(json.dumps([finding.as_dict() for finding in findings], indent=2))
    else:
        click.echo(markdown(findings), nl=False)
    if any(finding.breaking for finding in findings):
        raise SystemExit(1)


def contracts_in(path: Path) -> list[Contract]:
    """The contract of each document at ``path``: a file, or a directory's ``*.json``, ``*.yaml`` and ``*.yml``."""
    files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES) if path.is_dir() else [path]
    found = []
    for file in files:
        try:
            found.append(read(_load(file)))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise click.ClickException(f"{file} is not an AsyncAPI document of a service ({exc!r})") from None
    return found


def _load(file: Path) -> Any:
    text = file.read_text()
    if file.suffix == ".json":
        return json.loads(text)
    try:
        import yaml
    except ImportError:
        raise click.ClickException(
            f"reading {file} needs PyYAML: install 'celery-amqp-events[asyncapi]', or write the documents as JSON"
        ) from None
    return yaml.safe_load(text)
