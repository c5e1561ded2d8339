"""A test process's apps pointed at the broker a test started its workers on.

``start_worker("orders.celery")`` gives the worker the test's vhost in
``BROKER_URL`` (Celery's command line reads it); the test's own
``invoice_paid(...)`` runs in the test process, whose app keeps the URL its
module was written with. So the apps of the process that were written for the
same broker as the worker's app are pointed at the test's broker until the test
ends: what the test fires reaches the workers it started, and the user's files
are not rewritten.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from celery import _state

from amqp_events.celery.app import EventsApp

logger = logging.getLogger(__name__)


@contextmanager
def apps_pointed_at(url: str, module: str) -> Iterator[list[EventsApp]]:
    """Every live :class:`EventsApp` of this process written for the broker of ``module``'s app uses ``url``
    until the block ends (their connections closed on the way in and out). A module the test process cannot
    import (the worker's environment may hold what it reads) changes nothing."""
    written = _written_url(module)
    apps = [
        app
        for app in list(_state._apps)
        if isinstance(app, EventsApp) and written is not None and app.conf.broker_url == written
    ]
    for app in apps:
        app.close()
        app.conf.broker_url = url
    try:
        yield apps
    finally:
        for app in apps:
            app.close()
            app.conf.broker_url = written


def _written_url(module: str) -> str | None:
    """The broker URL of the app in ``module`` (``orders.celery`` or ``orders.celery:app``) as written."""
    name, _, attribute = module.partition(":")
    try:
        loaded = importlib.import_module(name)
    except Exception:  # it fails in the test process alone: there is nothing of it to point
        logger.debug("apps of %s not pointed at the test's broker: it cannot be imported here", name, exc_info=True)
        return None
    candidates = [getattr(loaded, attribute or "app", None), getattr(loaded, "celery", None)]
    for candidate in candidates:
        if isinstance(candidate, EventsApp):
            written: str | None = candidate.conf.broker_url
            return written
    return None
