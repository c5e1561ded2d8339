"""The console's web application (Starlette): who is asking, the CSRF check on every change, clear 4xx errors.

Every request is authenticated first (:mod:`amqp_events.console.security`):
an unknown caller gets a 401 asking for HTTP Basic credentials. A change
(any ``POST``) also needs the operator role and the CSRF token: the page
sets it in the ``csrf`` cookie and sends it back in the ``X-CSRF-Token``
header (double submit); a script with a bearer token the console knows
sends no cookie and is not a browser a forged page could drive, so it
needs none. Errors are JSON ``{"error": ...}`` with a 4xx status, never a
traceback. Every answer forbids framing (a page of another site could
make an operator click Replay or Purge in a hidden frame), sniffing and
scripts from anywhere but the console's own static files.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from amqp_events.console import api, pages
from amqp_events.console.fleet import Fleet
from amqp_events.console.security import Access, LoginThrottle, Who, csrf_matches, csrf_token, is_loopback
from amqp_events.console.urls import back_to
from amqp_events.errors import ManagementError, PermissionRefused, UnknownService

logger = logging.getLogger(__name__)
CSRF_COOKIE, CSRF_HEADER = "csrf", "x-csrf-token"
#: On every answer. The pages' scripts and styles are files of the console's own (no inline ones, no eval);
#: Pico CSS draws its icons from data: URIs.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def console_app(fleet: Fleet, access: Access, hosts: list[str] | None = None) -> Starlette:
    """The console for ``fleet``'s vhost, letting in whoever ``access`` knows, answering requests for ``hosts``
    (the ``Host`` header; any, if not given) only."""

    @contextlib.asynccontextmanager
    async def listening(_: Starlette) -> AsyncIterator[None]:
        fleet.listen()
        yield
        fleet.stop()

    app = ConsoleApp(
        routes=[*pages.routes, *api.routes],
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=hosts or ["*"]),  # before anything else: DNS rebinding
            Middleware(Guard, access=access),
        ],
        exception_handlers={
            HTTPException: http_error,
            UnknownService: not_found,
            PermissionRefused: forbidden,
            ManagementError: unavailable,
            **dict.fromkeys(fleet.app.context.transport.errors, unavailable),
            Exception: server_error,
        },
        lifespan=listening,
    )
    app.state.fleet = fleet
    return app


class ConsoleApp(Starlette):
    """Starlette, with :data:`SECURITY_HEADERS` put on every answer: around Starlette's own outermost layer, which
    answers an unexpected exception (a 500) outside any middleware added the usual way."""

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(super().build_middleware_stack())


class SecurityHeaders:
    """Puts :data:`SECURITY_HEADERS` on every HTTP answer of ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).update(SECURITY_HEADERS)
            await send(message)

        await self.app(scope, receive, with_headers)


class Guard(BaseHTTPMiddleware):
    """Authentication, the operator role and the CSRF token for changes; a CSRF cookie for every browser."""

    def __init__(self, app: Any, access: Access) -> None:
        super().__init__(app)
        self.access = access
        self.throttle = LoginThrottle()

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        client = request.client.host if request.client else ""
        authorization = request.headers.get("authorization")
        # A token is a long random secret, not a password one could guess: it gets in even while its address is
        # refused logins (a wrong one is a failed login, below).
        who = self.access.token_holder(authorization)
        if who is None and authorization:
            started = self.throttle.attempt(client)  # counted now: guesses sent at once are counted at once
            if started is None:
                return JSONResponse({"error": "too many failed logins from this address: wait a minute"}, 429)
            # PBKDF2 takes a fraction of a second: in a thread, so that the event loop serves others meanwhile.
            who = await run_in_threadpool(self.access.who, authorization, is_loopback(client))
            if who is not None:
                self.throttle.succeeded(client, started)
        elif who is None:
            who = self.access.who(None, is_loopback(client))  # no credentials: nothing to hash
        if who is None:
            return JSONResponse(
                {"error": "authentication required"},
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="amqp-events console"'},
            )
        if request.method not in ("GET", "HEAD"):
            refused = self._refuses_change(request, who)
            if refused is not None:
                logger.warning("console: %s refused (%s %s): %s", who.name, request.method, request.url.path, refused)
                return JSONResponse({"error": refused}, status_code=403)
        request.state.who = who
        response = await call_next(request)
        if CSRF_COOKIE not in request.cookies:
            response.set_cookie(CSRF_COOKIE, csrf_token(), httponly=False, samesite="strict")
        return response

    def _refuses_change(self, request: Request, who: Who) -> str | None:
        if not who.may_change:
            return f"{who.name} may only look (role {who.role})"
        if not who.by_token and not csrf_matches(request.cookies.get(CSRF_COOKIE), request.headers.get(CSRF_HEADER)):
            return "missing or wrong CSRF token: reload the page"
        return None


def answer(request: Request, error: str, status: int) -> Response:
    """An error as the API's JSON, or as a page for a browser's page request (never raw JSON in a page)."""
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": error}, status_code=status)
    sent = request.scope.get("raw_path") or request.url.path.encode()
    context: dict[str, Any] = {
        "services_nav": [],
        "who": getattr(request.state, "who", None),
        "error": error,
        "again": back_to(sent.decode("latin-1")),
    }
    return pages.templates.TemplateResponse(request, "error.html", context, status_code=status)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return answer(request, str(exc.detail), exc.status_code)


async def not_found(request: Request, exc: Exception) -> Response:
    return answer(request, str(exc), 404)


async def forbidden(request: Request, exc: Exception) -> Response:
    """The console's broker user may not do it (another service's archive, under a service's own user)."""
    return answer(request, str(exc), 403)


async def unavailable(request: Request, exc: Exception) -> Response:
    logger.warning("console: %s %s: the broker cannot be reached: %s", request.method, request.url.path, exc)
    if isinstance(exc, ManagementError):
        return answer(
            request,
            f"{exc}. The console reads queue counts there: give it with --management-url or "
            "AMQP_EVENTS_MANAGEMENT_URL (a broker from `amqp-events broker start` is found by itself)",
            503,
        )
    return answer(request, f"the broker cannot be reached now: {type(exc).__name__}: {exc}", 503)


async def server_error(request: Request, exc: Exception) -> Response:
    logger.exception("console: %s %s failed", request.method, request.url.path)
    return answer(request, f"{type(exc).__name__}: the console could not do it (see its log)", 500)
