"""What every ``amqp-events`` command shares: the global options, the app, and one-line errors."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from amqp_events.celery import EventsApp
from amqp_events.errors import (
    AmqpEventsError,
    InvalidName,
    ManagementError,
    PermissionRefused,
    PublishError,
    TopologyMismatch,
    TopologyMissing,
)
from amqp_events.transport.inspection import MISSING, UNREACHABLE, shown, vhost_of
from amqp_events.transport.management import ManagementAPI

F = TypeVar("F", bound=Callable[..., Any])

#: Failures an operator can act on: one line on stderr and exit status 1, no traceback.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (
    *UNREACHABLE,
    *MISSING,
    PublishError,
    TopologyMismatch,
    TopologyMissing,
    ManagementError,
    InvalidName,
    PermissionRefused,
)


def expecting(*errors: type[BaseException]) -> Callable[[F], F]:
    """Turn ``errors`` raised by a command into one line on stderr and exit status 1."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return command(*args, **kwargs)
            except errors as exc:
                raise click.ClickException(first_line(exc) + where(exc)) from None

        return wrapper  # type: ignore[return-value]

    return decorate


one_line_errors = expecting(*EXPECTED_ERRORS)


def where(exc: BaseException) -> str:
    """For a broker that cannot be reached: which one (its URL, without the password)."""
    if not isinstance(exc, UNREACHABLE):
        return ""
    context = click.get_current_context(silent=True)
    found = context.find_object(Context) if context else None
    app = found.__dict__.get("app") if found else None  # only an app already loaded: never load one here
    return f" (broker {shown(app.conf.broker_url)})" if app is not None else ""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, MISSING):
        text = f"not found on the broker: {getattr(exc, 'reply_text', text)}"
    return text.splitlines()[0]


class AppNotFound(click.ClickException):
    pass


class Context:
    """Global options; the app is loaded only by the commands that need it."""

    def __init__(self, app_name: str | None, broker: str | None, management_url: str | None) -> None:
        self.app_name, self.broker, self.management_url = app_name, broker, management_url

    @functools.cached_property
    def app(self) -> EventsApp:
        if not self.app_name:
            raise click.UsageError("this command needs the app: pass -A/--app MODULE[:ATTR]")
        from celery.app.utils import find_app

        # A mistake the library finds in the app's code (a second handler for one event, an option it refuses) is
        # one line, as every other error of the command line; an error of the code itself keeps its traceback.
        try:
            app = find_app(self.app_name)
        except (ImportError, AttributeError, ValueError) as exc:
            # kombu reports an import's ValueError (the library's errors are ValueErrors) as a ValueError of its own.
            found = exc.__context__ if isinstance(exc.__context__, AmqpEventsError) else exc
            if isinstance(found, ValueError) and not isinstance(found, AmqpEventsError):
                raise
            raise AppNotFound(f"cannot load app {self.app_name!r}: {found}") from None
        if not isinstance(app, EventsApp):
            raise AppNotFound(f"{self.app_name!r} is a {type(app).__name__}, not an app made with events_app()")
        if self.broker:
            app.conf.broker_url = self.broker
        # As a worker loads it: the modules of its imports= and include= register their handlers and events.
        try:
            app.loader.import_default_modules()
        except (ImportError, AmqpEventsError) as exc:
            raise AppNotFound(f"cannot load the modules of app {self.app_name!r}: {exc}") from None
        return app

    def app_or_any(self, service: str) -> EventsApp:
        """The ``-A`` app, or without one an app of ``service`` that handles nothing, on ``--broker`` (or
        ``AMQP_EVENTS_BROKER_URL``): for commands that look at every service of a vhost."""
        if self.app_name:
            return self.app
        from amqp_events.celery import events_app

        app = events_app(service, broker_url=self.broker)
        self.__dict__["app"] = app  # what the cached property holds: vhost and management read it
        return app

    @property
    def vhost(self) -> str:
        return vhost_of(self.app.conf.broker_url)

    @property
    def management(self) -> ManagementAPI:
        """The management API: ``--management-url``, the local node's (``amqp-events broker start``) when the
        app talks to it, else port 15672 beside the broker."""
        from amqp_events.local import management_url_for

        broker_url = self.app.conf.broker_url
        found = self.management_url or management_url_for(broker_url)
        if found:
            return ManagementAPI(found)
        return ManagementAPI.for_amqp_url(broker_url)


pass_context = click.make_pass_decorator(Context)


def current_context() -> Context:
    context = click.get_current_context().find_object(Context)
    if context is None:  # only when a command is invoked without the main group
        raise click.UsageError("run this command through `amqp-events`")
    return context
