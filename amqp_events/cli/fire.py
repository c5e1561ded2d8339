"""``amqp-events fire EVENT``: fire an event from the shell."""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence, Set
from typing import Any

import click

from amqp_events.cli.context import Context, one_line_errors, pass_context
from amqp_events.core.context import Firing, Middleware
from amqp_events.core.events import argument_annotations


@click.command()
@click.argument("event")
@click.option("--json", "payload", metavar="PAYLOAD", help="Keyword arguments as a JSON object (or an array of args).")
@click.option("--arg", "pairs", multiple=True, metavar="KEY=VALUE", help="A keyword argument; VALUE is JSON or text.")
@click.option("--countdown", type=float, help="Seconds to wait on the broker before delivery.")
@click.option("--no-validate", is_flag=True, help="Skip the validation of the event the app declares.")
@click.option("--key", "event_key", metavar="KEY", help="The event's key, for an event fired as given.")
@pass_context
@one_line_errors
def fire(
    context: Context,
    event: str,
    payload: str | None,
    pairs: Sequence[str],
    countdown: float | None,
    no_validate: bool,
    event_key: str | None,
) -> None:
    """Fire EVENT from the shell and print its id once the broker confirmed it.

    An event the app declares (``@app.event``) is validated first, as the
    Python call does: a payload it refuses is not fired (``--no-validate``
    skips that), and its key comes from the payload as declared. Other events
    are fired as given, with ``--key`` if they belong to an aggregate.
    """
    app = context.app
    args, kwargs = parse_payload(payload, pairs, as_text=text_arguments(app.declared_events.get(event)))
    results = FireResults()
    app.add_middleware(results)
    click.echo(fire_one(app, event, args, kwargs, countdown, no_validate, event_key))
    if "unroutable" in results.seen:
        known = sorted({*app.declared_events, *app.handlers})
        close = difflib.get_close_matches(event, known, n=3, cutoff=0.75)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise click.ClickException(f"no service subscribes to {event!r} on this vhost: nothing received it{hint}")


class FireResults(Middleware):
    """What became of each fire (``confirmed``, ``unroutable``): a command's own look at its result."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def after_fire(self, firing: Firing, result: str, error: BaseException | None) -> None:
        self.seen.append(result)


def fire_one(
    app: Any,
    event: str,
    args: list[Any],
    kwargs: dict[str, Any],
    countdown: float | None,
    no_validate: bool,
    event_key: str | None,
) -> str:
    """Fire ``event``, validated when the app declares it; its id."""
    declared = app.declared_events.get(event)
    if declared is None or no_validate:  # an event the app does not declare has nothing to validate it
        return str(app.fire(event, args, kwargs, countdown=countdown, key=event_key))
    if event_key is not None:
        raise click.UsageError(
            f"{event!r} is declared by the app, which gives its key: --key is for events fired as given"
        )
    try:
        if isinstance(declared, type):  # an event class: constructing it is the validation
            instance = declared(*args, **kwargs)
        else:
            declared.validate(*args, **kwargs)
    except Exception as exc:
        raise click.ClickException(f"{event!r} not fired: its validation refused the payload: {exc!r}") from None
    if isinstance(declared, type):
        return str(instance.fire(countdown=countdown))
    return str(declared.fire(tuple(args), kwargs, countdown=countdown))


def text_arguments(declared: Any) -> set[str]:
    """The arguments a declared event takes as ``str``: ``--arg amount=10.00`` gives them the text as typed."""
    if declared is None:
        return set()
    return {name for name, hint in argument_annotations(declared).items() if hint in (str, "str")}


def parse_payload(
    payload: str | None, pairs: Sequence[str], as_text: Set[str] = frozenset()
) -> tuple[list[Any], dict[str, Any]]:
    """``--json`` and ``--arg`` as arguments: a value is JSON where it reads as JSON, else text (always text for
    the arguments ``as_text`` names)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    if payload:
        try:
            decoded = json.loads(payload)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--json") from None
        if isinstance(decoded, list):
            args = decoded
        elif isinstance(decoded, dict):
            kwargs = decoded
        else:
            raise click.BadParameter("must be a JSON object or array", param_hint="--json")
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--arg")
        try:
            kwargs[key] = value if key in as_text else json.loads(value)
        except ValueError:
            kwargs[key] = value
    return args, kwargs
