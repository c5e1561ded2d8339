"""The console's JSON API: what its pages show and do, for scripts too (documented in docs/guides/console.md).

========================================================  ==========================================
``GET  /api/services``                                    the services found, their queues and archive sizes
``GET  /api/services/{service}/archive``                  archived messages (``?event=&reason=&since=&id=&limit=``)
``GET  /api/services/{service}/archive/{id}``             one, with its arguments, exception and traceback
``POST /api/services/{service}/archive/replay``           replay ``{"ids": [...]}`` or ``{"event", "reason", "since"}``
``POST /api/services/{service}/archive/purge``            the same choice, and ``"confirm": "<service>"``
``POST /api/services/{service}/handlers/{handler}/pause``  pause a handler in every worker (``resume``: again)
``GET  /api/fleet``                                       one row per service, those with a problem first
``GET  /api/services/{service}/groups``                   the archive's failures grouped by cause
``GET  /api/services/{service}/groups/{id}``              one group, with its members and their arguments
``POST /api/services/{service}/groups/{id}/replay``       replay every message of a group (``purge``: with
                                                          ``"confirm": "<service>"``)
``POST /api/services/{service}/archive/{id}/retry``       replay one with edited ``{"args": [], "kwargs": {}}``
``GET  /api/audit``                                       the event log (``?service=&who=&action=&limit=``)
========================================================  ==========================================
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from amqp_events.archive import Selection
from amqp_events.clock import parse_moment
from amqp_events.console.fleet import Fleet
from amqp_events.console.index import Snapshot
from amqp_events.console.urls import SegmentRoute
from amqp_events.errors import BadArguments, SteeringError
from amqp_events.limits.overrides import Override
from amqp_events.wire.archive_entries import ArchivedMessage
from amqp_events.wire.message import Reason

#: The most messages one listing returns.
MAX_LIMIT = 10_000
REASONS = {reason.value for reason in Reason}


def fleet_of(request: Request) -> Fleet:
    fleet: Fleet = request.app.state.fleet
    return fleet


def chosen(values: dict[str, Any], default_limit: int | None = None) -> Selection:
    """The archived messages a request chooses; a clear 400 for a malformed choice."""
    ids = values.get("ids") or ([values["id"]] if values.get("id") else [])
    if not isinstance(ids, list) or not all(isinstance(one, str) and one for one in ids):
        raise HTTPException(400, "ids: a list of message ids")
    reason = values.get("reason") or None
    if reason is not None and reason not in REASONS:
        raise HTTPException(400, f"reason: one of {', '.join(sorted(REASONS))}")
    event = values.get("event") or None
    if event is not None and not isinstance(event, str):
        raise HTTPException(400, "event: an event name")
    limit = values.get("limit", default_limit)
    try:
        limit = None if limit in (None, "") else int(limit)
    except (TypeError, ValueError):
        limit = -1
    if limit is not None and not 0 < limit <= MAX_LIMIT:
        raise HTTPException(400, f"limit: a whole number from 1 to {MAX_LIMIT}")
    since = values.get("since") or None
    try:
        since_time = None if since is None else parse_moment(str(since), datetime.now(timezone.utc))
    except ValueError as exc:
        raise HTTPException(400, f"since: {exc}") from None
    return Selection.of(ids=ids, event=event, reason=reason, limit=limit, since=since_time)


#: Bytes of a body the console shows (its payload and arguments); a larger one is only described: an answer
#: stays small whatever the archive holds (``archive show`` and ``export`` give it whole).
SHOWN_BODY = 256 * 1024
#: Characters of one header value it shows.
SHOWN_HEADER = 1000


def detail(message: ArchivedMessage) -> dict[str, Any]:
    """An archived message as the console shows it: its summary, arguments, traceback, trace and headers, each
    bounded (``not_shown`` says what was left out)."""
    shown = len(message.body) <= SHOWN_BODY
    return {
        **message.summary(),
        "payload": message.payload if shown else None,
        "arguments": message.named_arguments if shown else None,
        "body_bytes": len(message.body),
        "not_shown": None
        if shown
        else f"its body is {len(message.body)} bytes, more than the console shows ({SHOWN_BODY}): "
        "`amqp-events archive show` or `export` gives it",
        "traceback": message.traceback,
        "last_failure_at": message.last_failure_at.isoformat() if message.last_failure_at else None,
        "trace_id": trace_id(message.headers.get("traceparent")),
        "headers": {
            name: value[:SHOWN_HEADER] if isinstance(value, str) else value
            for name, value in message.headers.items()
            if isinstance(value, str | int | float)
        },
    }


def trace_id(traceparent: object) -> str | None:
    """The trace id of a W3C ``traceparent`` header (``00-<trace id>-<span id>-<flags>``)."""
    parts = traceparent.split("-") if isinstance(traceparent, str) else []
    return parts[1] if len(parts) == 4 else None


async def services(request: Request) -> JSONResponse:
    found = await run_in_threadpool(fleet_of(request).services)
    return JSONResponse([{**asdict(service), "consumers": service.consumers} for service in found])


async def archive(request: Request) -> JSONResponse:
    selection = chosen(dict(request.query_params), default_limit=MAX_LIMIT)
    messages = await run_in_threadpool(fleet_of(request).archived, request.path_params["service"], selection)
    return JSONResponse({"messages": [message.summary() for message in messages]})


async def archived_one(request: Request) -> JSONResponse:
    chosen_one = Selection.of(ids=[request.path_params["id"]])
    found = await run_in_threadpool(fleet_of(request).archived, request.path_params["service"], chosen_one)
    if not found:
        raise HTTPException(404, f"no archived message {request.path_params['id']!r}")
    return JSONResponse(detail(found[0]))


async def replay(request: Request) -> JSONResponse:
    selection = chosen(await body_of(request))
    if not selection.chooses:
        raise HTTPException(400, "choose what to replay: ids, or an event, a reason or a time")
    replayed = await run_in_threadpool(fleet_of(request).replay, request.path_params["service"], selection, by(request))
    if selection.ids and not any(replayed.values()):
        raise HTTPException(404, f"no archived message with the id(s) {', '.join(sorted(selection.ids))}")
    return JSONResponse(replayed)


async def purge(request: Request) -> JSONResponse:
    values = await body_of(request)
    service = confirmed(values, request.path_params["service"])
    selection = chosen(values)
    if not selection.chooses:
        raise HTTPException(400, "choose what to purge: ids, or an event, a reason or a time")
    purged = await run_in_threadpool(fleet_of(request).purge, service, selection, by(request))
    if selection.ids and not purged:
        raise HTTPException(404, f"no archived message with the id(s) {', '.join(sorted(selection.ids))}")
    return JSONResponse({"purged": purged})


def confirmed(values: dict[str, Any], service: str) -> str:
    if values.get("confirm") != service:
        raise HTTPException(400, f"a purge cannot be undone: confirm it with the service's name, {service!r}")
    return service


async def fleet(request: Request) -> JSONResponse:
    rows = await run_in_threadpool(fleet_of(request).rows)
    reading = fleet_of(request).reading()
    return JSONResponse(
        {
            "read_at": reading.at.isoformat(),
            "delayed": reading.delayed,
            "services": [row.summary() for row in rows],
        }
    )


async def groups(request: Request) -> JSONResponse:
    snapshot = await run_in_threadpool(fleet_of(request).snapshot, request.path_params["service"])
    return JSONResponse({**read_at(snapshot), "groups": [group.summary() for group in snapshot.groups]})


async def group(request: Request) -> JSONResponse:
    snapshot = await run_in_threadpool(fleet_of(request).snapshot, request.path_params["service"])
    found = snapshot.group(request.path_params["id"])
    if found is None:
        raise HTTPException(404, f"no failure group {request.path_params['id']!r} in {snapshot.service}'s archive")
    members = [entry.summary() for entry in snapshot.members(found.id)]
    return JSONResponse({**read_at(snapshot), **found.summary(), "members": members})


def read_at(snapshot: Snapshot) -> dict[str, Any]:
    return {"read_at": snapshot.read_at.isoformat() if snapshot.read_at else None, "archived": snapshot.count}


async def replay_group(request: Request) -> JSONResponse:
    service, group_id = request.path_params["service"], request.path_params["id"]
    selection = Selection.of(group=group_id)
    target = f"group {group_id}"
    replayed = await run_in_threadpool(fleet_of(request).replay, service, selection, by(request), target)
    if not any(replayed.values()):
        raise HTTPException(404, f"no archived message of the group {group_id!r}")
    return JSONResponse(replayed)


async def purge_group(request: Request) -> JSONResponse:
    service, group_id = confirmed(await body_of(request), request.path_params["service"]), request.path_params["id"]
    selection = Selection.of(group=group_id)
    target = f"group {group_id}"
    purged = await run_in_threadpool(fleet_of(request).purge, service, selection, by(request), target)
    if not purged:
        raise HTTPException(404, f"no archived message of the group {group_id!r}")
    return JSONResponse({"purged": purged})


async def retry_edited(request: Request) -> JSONResponse:
    """Replay one archived message with edited arguments, once they fit its handler."""
    values = await body_of(request)
    args, kwargs = values.get("args", []), values.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise HTTPException(400, 'the arguments: {"args": [...], "kwargs": {...}}')
    service, message_id = request.path_params["service"], request.path_params["id"]
    try:
        done = await run_in_threadpool(fleet_of(request).retry_edited, service, message_id, args, kwargs, by(request))
    except (BadArguments, ValueError) as exc:
        raise HTTPException(400, f"not sent: {exc}") from None
    if not done:
        raise HTTPException(404, f"no archived message {message_id!r}")
    return JSONResponse({"retried": message_id})


async def audit(request: Request) -> JSONResponse:
    query = request.query_params
    try:
        limit = int(query.get("limit") or 500)
    except ValueError:
        raise HTTPException(400, "limit: a whole number") from None
    found = fleet_of(request).audit.records(query.get("service"), query.get("who"), query.get("action"), limit)
    return JSONResponse({"records": [asdict(record) for record in found]})


async def pause(request: Request) -> JSONResponse:
    return await steer(request, "open")


async def resume(request: Request) -> JSONResponse:
    return await steer(request, "close")


async def steer(request: Request, action: str) -> JSONResponse:
    """Open (pause) or close (resume) a handler's breaker in every live worker of the service."""
    service, handler = request.path_params["service"], request.path_params["handler"]
    try:
        matched = await run_in_threadpool(fleet_of(request).steer, service, handler, action, by(request))
    except SteeringError as exc:
        raise HTTPException(409, str(exc)) from None
    if not matched:
        raise HTTPException(404, f"no live worker of {service!r} has a handler called {handler!r}")
    return JSONResponse({"workers": matched})


async def limits(request: Request) -> JSONResponse:
    try:
        table = await run_in_threadpool(fleet_of(request).limits, request.path_params["service"])
    except ValueError as exc:
        raise HTTPException(409, f"the limits set at run time cannot be read: {exc}") from None
    return JSONResponse({"limits": {task: asdict(row) for task, row in table.items()}})


async def set_limits(request: Request) -> JSONResponse:
    """A handler's limits in every worker of the service: ``{"concurrency": 3, "rate_limit": "50/m"}`` (``null``: no
    such limit), or ``{"reset": true}``: its code's again."""
    values = await body_of(request)
    if set(values) - {"concurrency", "rate_limit", "reset"}:
        raise HTTPException(400, "give concurrency and rate_limit, or reset")
    try:
        row = None if values.get("reset") is True else Override(values.get("concurrency"), values.get("rate_limit"))
    except (ValueError, TypeError) as exc:
        raise HTTPException(400, str(exc)) from None
    service, task = request.path_params["service"], request.path_params["handler"]
    try:
        table = await run_in_threadpool(fleet_of(request).set_limits, service, task, row, by(request))
    except LookupError as exc:
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(409, f"the limits set at run time cannot be read: {exc}") from None
    return JSONResponse({"limits": {task: asdict(row) for task, row in table.items()}})


async def body_of(request: Request) -> dict[str, Any]:
    try:
        values = await request.json()
    except ValueError:
        raise HTTPException(400, "the request's body is not JSON") from None
    except RecursionError:  # the JSON parser recurses once a level: deeper than the interpreter allows
        raise HTTPException(400, "the request's body is nested too deep") from None
    if not isinstance(values, dict):
        raise HTTPException(400, "the request's body is not a JSON object")
    return values


def by(request: Request) -> str:
    """Who made a change, as the replayed message and the audit log record it."""
    client = request.client.host if request.client else "?"
    return f"{request.state.who.name}@console({client})"


#: Message ids and handler names are whatever producers and operators chose: read from the path as it was sent
#: (:class:`~amqp_events.console.urls.SegmentRoute`), a ``/`` in one is part of it.
routes = [
    Route("/api/fleet", fleet),
    Route("/api/audit", audit),
    Route("/api/services/{service}/groups", groups),
    Route("/api/services/{service}/groups/{id}", group),
    Route("/api/services/{service}/groups/{id}/replay", replay_group, methods=["POST"]),
    Route("/api/services/{service}/groups/{id}/purge", purge_group, methods=["POST"]),
    SegmentRoute("/api/services/{service}/archive/{id}/retry", retry_edited, methods=["POST"]),
    Route("/api/services", services),
    Route("/api/services/{service}/archive", archive),
    Route("/api/services/{service}/archive/replay", replay, methods=["POST"]),
    Route("/api/services/{service}/archive/purge", purge, methods=["POST"]),
    SegmentRoute("/api/services/{service}/archive/{id}", archived_one),
    SegmentRoute("/api/services/{service}/handlers/{handler}/pause", pause, methods=["POST"]),
    SegmentRoute("/api/services/{service}/handlers/{handler}/resume", resume, methods=["POST"]),
    Route("/api/services/{service}/limits", limits),
    SegmentRoute("/api/services/{service}/limits/{handler}", set_limits, methods=["POST"]),
]
