"""The console's pages: the overview of every service, and a service's archive (Jinja2 templates, no build step).
What the pages change, they change through the JSON API (:mod:`amqp_events.console.api`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from amqp_events.archive import Selection
from amqp_events.console import chart
from amqp_events.console.api import REASONS, chosen, detail, fleet_of
from amqp_events.console.discovery import ServiceQueues
from amqp_events.console.fleet import Fleet
from amqp_events.errors import ManagementError

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
#: Messages an archive page lists at most (the API lists more; "Replay all matching" takes every one).
PAGE_LIMIT = 500
#: The span of the overview's charts (seconds).
CHART_SPAN = 3600


async def overview(request: Request) -> Response:
    return await run_in_threadpool(_overview, request, fleet_of(request))


def _overview(request: Request, fleet: Fleet) -> Response:
    services = fleet.services(samples_for=CHART_SPAN)
    by_reason = {
        service.name: sorted(Counter(m.reason for m in fleet.archived(service.name, Selection())).items())
        for service in services
    }
    history = fleet.history()
    try:
        nodes = fleet.management.nodes()
    except ManagementError:  # a user without the monitoring tag may not list nodes
        nodes = []
    context = {
        "vhost": fleet.vhost,
        "services": services,
        "by_reason": by_reason,
        "charts": {service.name: _chart(service) for service in services},
        "workers": {service.name: fleet.workers(service.name) for service in services},
        "heartbeat_window": round(2 * fleet.app.events_settings.heartbeat_interval),
        "history": history,
        "databases": fleet.databases(),
        "nodes": nodes,
    }
    return page(request, "overview.html", services, context)


async def archive(request: Request) -> Response:
    return await run_in_threadpool(_archive, request, fleet_of(request))


def _archive(request: Request, fleet: Fleet) -> Response:
    service = request.path_params["service"]
    filters = dict(request.query_params)
    selection = chosen(filters, default_limit=PAGE_LIMIT)
    messages = [detail(message) for message in fleet.archived(service, selection)]
    wanted = {name: filters[name] for name in ("event", "reason", "since") if filters.get(name)}
    context = {
        "service": service,
        "messages": messages,
        "filters": filters,
        "filters_query": urlencode(wanted),
        "reasons": sorted(REASONS),
        "parked": fleet.parked(service),
    }
    return page(request, "archive.html", fleet.services(), context)


def page(request: Request, template: str, services: list[ServiceQueues], context: dict[str, Any]) -> Response:
    navigation = {"services_nav": [service.name for service in services], "who": request.state.who}
    return templates.TemplateResponse(request, template, {**navigation, **context})


def _chart(service: ServiceQueues) -> str:
    return chart.svg(
        [
            chart.Line("archived", service.archived_over_time, "#b00020"),
            chart.Line("handled per minute", service.handled_over_time, "#1b5fbf"),
        ],
        f"{service.name}: archived and handled over the last hour",
    )


routes = [Route("/", overview), Route("/services/{service}/archive", archive)]
