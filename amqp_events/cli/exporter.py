"""``amqp-events exporter``: serve the service's broker-side metrics for Prometheus."""

from __future__ import annotations

import time

import click

from amqp_events.cli.context import Context, one_line_errors, pass_context
from amqp_events.metrics import AVAILABLE


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve /metrics on.")
@click.option("--port", default=9808, type=int, show_default=True)
@click.option("--interval", default=15.0, show_default=True, help="Seconds between collections from the broker.")
@click.option("--worker-timeout", default=30.0, show_default=True, help="Silent seconds before a worker reads down.")
@click.option("--forget-after", default=600.0, show_default=True, help="Silent seconds before a worker's series go.")
@click.option("--no-management", is_flag=True, help="Use passive declares only (no unacked counts).")
@pass_context
@one_line_errors
def exporter(
    context: Context,
    host: str,
    port: int,
    interval: float,
    worker_timeout: float,
    forget_after: float,
    no_management: bool,
) -> None:
    """Serve the service's queue depths, consumers and workers online as Prometheus metrics."""
    if not AVAILABLE:
        raise click.ClickException(
            "the exporter needs prometheus-client: pip install 'celery-amqp-events[metrics]>=0.3'"
        )
    from amqp_events.exporter import Exporter

    management = None if no_management else context.management
    Exporter(context.app, management, interval, worker_timeout, forget_after).serve(host, port)
    click.echo(f"serving metrics of service {context.app.service!r} on http://{host}:{port}/metrics", err=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
