"""``amqp-events console``: the operator console in a browser (the ``console`` extra: Starlette, Jinja2, uvicorn)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from amqp_events.cli.context import current_context, one_line_errors
from amqp_events.console.security import Access, allowed_hosts, hash_password, refuses_to_start


@click.group(invoke_without_command=True)
@click.option("--bind", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT", help="Where to listen.")
@click.option(
    "--host-name",
    "host_names",
    multiple=True,
    metavar="NAME",
    help="A name the console is reached by (the Host header); requests for any other are refused (repeatable).",
)
@click.option(
    "--proxy",
    metavar="ADDRESS",
    help="The reverse proxy in front of the console: only its X-Forwarded-For is believed (for the audit trail).",
)
@click.option(
    "--refresh",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.2, 3600),
    metavar="SECONDS",
    help="How often the vhost is read again (the pages' figures follow without a reload).",
)
@click.option(
    "--audit-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="AMQP_EVENTS_CONSOLE_AUDIT_FILE",
    help="Keep the event log (every change made through the console) in this file, as JSON lines.",
)
@click.pass_context
@one_line_errors
def console(
    ctx: click.Context,
    bind: str,
    host_names: tuple[str, ...],
    proxy: str | None,
    refresh: float,
    audit_file: Path | None,
) -> None:
    """Serve the console: the services of the vhost at a glance, failures grouped by cause, replay (of a group,
    or of one message with edited arguments), purge, pause and resume, the event log of what was done.

    Off a loopback address it needs credentials (AMQP_EVENTS_CONSOLE_USERS, AMQP_EVENTS_CONSOLE_TOKEN,
    AMQP_EVENTS_CONSOLE_READ_TOKEN: see docs/guides/console.md).
    """
    if ctx.invoked_subcommand is not None:
        return
    try:
        import uvicorn

        from amqp_events.console.audit import AuditTrail
        from amqp_events.console.fleet import Fleet
        from amqp_events.console.web import console_app
    except ImportError as exc:
        extra = "pip install 'celery-amqp-events[console]>=0.3'"
        raise click.ClickException(f"the console needs its extra: {extra} ({exc})") from None
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise click.BadParameter(f"{bind!r} is not HOST:PORT", param_hint="--bind")
    try:
        access = Access.from_environment(os.environ)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    refused = refuses_to_start(host, access)
    if refused is not None:
        raise click.ClickException(refused)
    context = current_context()
    app = context.app_or_any("console")
    own = bool(context.app_name)
    fleet = Fleet(app, context.management, context.vhost, own, refresh, AuditTrail(audit_file))
    click.echo(f"console of vhost {context.vhost!r} on http://{bind}/", err=True)
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s: %(levelname)s] %(message)s")
    uvicorn.run(
        console_app(fleet, access, allowed_hosts(host, host_names)),
        host=host.strip("[]"),
        port=int(port),
        log_level="warning",
        # Upstream: uvicorn believes X-Forwarded-For from 127.0.0.1 by default; only from the proxy named here.
        proxy_headers=proxy is not None,
        forwarded_allow_ips=proxy or "",
    )


@console.command("hash-password")
def hash_password_command() -> None:
    """Print a password's hash for AMQP_EVENTS_CONSOLE_USERS (name:role:hash)."""
    password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    click.echo(hash_password(password))
