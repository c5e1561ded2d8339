"""``amqp-events -A APP asyncapi``: the service's AsyncAPI 3.0 document."""

from __future__ import annotations

import json
from typing import Any

import click

from amqp_events.asyncapi.document import document
from amqp_events.cli.context import Context, pass_context


@click.command()
@click.option("--format", "output_format", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("--api-version", default="1.0.0", show_default=True, help="The document's info.version.")
@click.option("-o", "--output", type=click.File("w"), default="-", help="Write to this file (default: stdout).")
@pass_context
def asyncapi(context: Context, output_format: str, api_version: str, output: Any) -> None:
    """Print the AsyncAPI 3.0 document of the app's service: the events it fires and handles."""
    app = context.app
    described = document(app.context, app.declared_events, app.conf.broker_url, api_version)
    if output_format == "json":
        output.write(json.dumps(described, indent=2) + "\n")
        return
    try:
        import yaml
    except ImportError:
        raise click.ClickException(
            "YAML needs PyYAML: install 'celery-amqp-events[asyncapi]>=0.3', or pass --format json"
        ) from None

    class Dumper(yaml.SafeDumper):  # type: ignore[misc]
        def ignore_aliases(self, data: Any) -> bool:  # each part written out where it is used, no &anchors
            return True

    output.write(yaml.dump(described, Dumper=Dumper, sort_keys=False, allow_unicode=True))
