"""The console's pages: the fleet at a glance, a service (its failures by cause, its archive, workers and queues),
a failure group, and the event log (Jinja2 templates; Pico CSS and uPlot shipped in the package, no build step).

Every page is made from the latest reading of the vhost and the archives' index (no browse while an operator
waits) and marks the parts that change with ``data-live``: the page's script fetches it again every refresh
interval and swaps those parts in. What the pages change, they change through the JSON API
(:mod:`amqp_events.console.api`).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from amqp_events.archive.reasons import MEANINGS
from amqp_events.console.api import REASONS, chosen, fleet_of
from amqp_events.console.audit import ACTIONS
from amqp_events.console.discovery import ServiceQueues, increments, summed
from amqp_events.console.fleet import Fleet
from amqp_events.console.index import Entry
from amqp_events.console.urls import segment
from amqp_events.topology.names import service_queue_name, task_of_queue

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
#: ``{{ message.id | segment }}``: a value put into a URL's path, quoted whole (never ``urlencode``: it leaves
#: ``/`` and ``.`` alone, and a browser resolves them).
templates.env.filters["segment"] = segment
#: Messages a service's page lists at most (the API lists more; "Replay all matching" takes every one).
PAGE_LIMIT = 500


async def overview(request: Request) -> Response:
    return await run_in_threadpool(_overview, request, fleet_of(request))


def _overview(request: Request, fleet: Fleet) -> Response:
    reading = fleet.reading()
    context = {
        "vhost": fleet.vhost,
        "reading": reading,
        "failure": fleet.watch.failure,
        "rows": fleet.rows(),
        "chart": chart(list(reading.services), reading.broker_started),
        "databases": fleet.databases(),
        "events": fleet.events(),
        "service": fleet.app.service if fleet.own else "",
    }
    return page(request, "overview.html", context)


async def service(request: Request) -> Response:
    return await run_in_threadpool(_service, request, fleet_of(request))


def _service(request: Request, fleet: Fleet) -> Response:
    name = request.path_params["service"]
    found = fleet.service(name)
    snapshot = fleet.snapshot(name)
    filters = dict(request.query_params)
    wanted = {key: filters[key] for key in ("event", "reason", "since") if filters.get(key)}
    context = {
        "service": name,
        "snapshot": snapshot,
        "row": next((row for row in fleet.rows() if row.name == name), None),
        "messages": _matching(snapshot.entries, wanted),
        "filters": filters,
        "filters_query": urlencode(wanted),
        "reasons": sorted(REASONS),
        "meanings": {str(reason): meaning for reason, meaning in MEANINGS.items()},
        # What the pause and limits forms offer: the handlers whose own queues the broker lists (the per_service
        # layout's handlers share one queue, which names none: its forms offer nothing and take any name).
        "handlers": sorted({task for queue in found.queues if (task := task_of_queue(name, queue.name))}),
        "parked": fleet.parked(name),
        "limits": _limits(fleet, name),
        "workers": fleet.workers(name),
        "heartbeat_window": round(2 * fleet.app.events_settings.heartbeat_interval),
        "per_service": any(queue.name == service_queue_name(name) for queue in found.queues),
        "chart": chart([found], fleet.reading().broker_started),
    }
    return page(request, "archive.html", context)


def _limits(fleet: Fleet, service: str) -> dict[str, Any] | str:
    """The limits set at run time, or why they cannot be shown (the page shows the rest either way)."""
    try:
        return fleet.limits(service)
    except Exception as exc:  # unreadable, or refused to the console's user
        return f"The limits set at run time cannot be read: {exc}"


def _matching(entries: tuple[Entry, ...], wanted: dict[str, str]) -> list[Entry]:
    """The newest :data:`PAGE_LIMIT` entries that match the page's filters (checked as the API checks them: a
    clear 400), newest first."""
    selection = chosen(wanted)
    found = (entry for entry in reversed(entries) if selection.admits(entry.event, entry.reason, entry.archived_at))
    return list(itertools.islice(found, PAGE_LIMIT))


async def group(request: Request) -> Response:
    return await run_in_threadpool(_group, request, fleet_of(request))


def _group(request: Request, fleet: Fleet) -> Response:
    name, group_id = request.path_params["service"], request.path_params["id"]
    snapshot = fleet.snapshot(name)
    found = snapshot.group(group_id)
    if found is None:
        raise HTTPException(404, f"no failure group {group_id!r} in {name}'s archive (replayed or purged since?)")
    context = {
        "service": name,
        "snapshot": snapshot,
        "group": found,
        "members": list(reversed(snapshot.members(group_id)))[:PAGE_LIMIT],
        "traceback": snapshot.tracebacks.get(group_id, ""),
    }
    return page(request, "group.html", context)


async def audit(request: Request) -> Response:
    fleet = fleet_of(request)
    filters = {key: value for key, value in request.query_params.items() if key in ("service", "who", "action")}
    context = {
        "records": fleet.audit.records(filters.get("service"), filters.get("who"), filters.get("action")),
        "filters": filters,
        "filters_query": urlencode({key: value for key, value in filters.items() if value}),
        "actions": list(ACTIONS),
        "action_words": list(ACTIONS.values()),
        "audit_file": fleet.audit.path,
    }
    return await run_in_threadpool(page, request, "audit.html", context)


def page(request: Request, template: str, context: dict[str, Any]) -> Response:
    fleet = fleet_of(request)
    try:
        services = [service.name for service in fleet.reading().services]
    except Exception:  # the event log is shown even when the broker cannot be reached
        services = []
    shared = {"services_nav": services, "who": request.state.who, "refresh": fleet.refresh}
    return templates.TemplateResponse(request, template, {**shared, **context})


def chart(services: list[ServiceQueues], since: float | None = None) -> dict[str, Any]:
    """The handled and archived per minute of ``services`` together, as uPlot's columns (times in seconds), from
    ``since`` on (when the broker started: before it, the samples are zeros nobody counted)."""
    handled = dict(summed(service.handled_over_time for service in services))
    archived = dict(summed(increments(service.archived_over_time) for service in services))
    moments = sorted(moment for moment in set(handled) | set(archived) if since is None or moment >= since)
    return {
        "t": moments,
        "series": [
            {"label": "handled per minute", "values": [handled.get(moment) for moment in moments]},
            {"label": "archived per minute", "values": [archived.get(moment) for moment in moments]},
        ],
    }


routes = [
    Route("/", overview),
    Route("/audit", audit),
    Route("/services/{service}/archive", service),
    Route("/services/{service}/groups/{id}", group),
    Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
]
