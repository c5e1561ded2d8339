"""Ids in the console's URLs, both ways: quoted whole into one path segment by the pages, read back from that one
segment by the routes.

A message's id is whatever its producer sent: ``../../billing/archive/victim-1`` is one. Put into a path with
its ``/`` and ``.`` as they are, a browser resolves it into another service's message; quoted whole, it is one
segment. The server must then read it from the path as sent: uvicorn decodes ``%2F`` into ``/`` before any
route sees the path, and the id would be several segments again.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote

from starlette.routing import Match, Route
from starlette.types import Scope


def segment(value: object) -> str:
    """``value`` as one path segment: every character but letters, digits, ``-``, ``_`` and ``~`` percent-encoded
    (``.`` too: a browser resolves ``..``). An id that is only ``.`` or ``..`` is the exception no quoting can
    help: browsers resolve ``%2E`` and ``%2E%2E`` as dot segments too, so its links lead to no route that acts
    (the archive's listing, a 404 or a 405), never to another message."""
    return quote(str(value), safe="").replace(".", "%2E")


class SegmentRoute(Route):
    """A route matched against the path as the client sent it (``raw_path``), each parameter then decoded: an id
    sent as ``..%2F..%2Fbilling%2Farchive%2Fvictim-1`` is that whole id, in the segment it was sent in."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        raw_path = scope.get("raw_path")
        if scope["type"] != "http" or raw_path is None:
            return super().matches(scope)
        # uvicorn puts root_path in front of raw_path as of path: Starlette takes it off the same way.
        match, child_scope = super().matches({**scope, "path": raw_path.decode("latin-1"), "path_params": {}})
        if match is not Match.NONE:
            decoded: dict[str, Any] = {name: unquote(value) for name, value in child_scope["path_params"].items()}
            child_scope["path_params"] = {**scope.get("path_params", {}), **decoded}
        return match, child_scope


def back_to(path: str) -> str:
    """A link to ``path`` (as sent) that stays on the console: exactly one leading ``/`` (``//evil.example/``, and
    ``/\\evil.example/`` to a browser, is another site), every character not plain in a path percent-encoded."""
    return "/" + quote(path.lstrip("/\\"), safe="/%")
