"""A small client of RabbitMQ's management HTTP API (stdlib only)."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.parse
import urllib.request
from base64 import b64encode
from typing import Any

from amqp_events.environment import variable
from amqp_events.errors import ManagementError
from amqp_events.topology.check import LiveTopology
from amqp_events.topology.permissions import Grants


class ManagementAPI:
    """Calls ``/api/...`` on a RabbitMQ node's management plugin."""

    def __init__(
        self, base_url: str, user: str | None = None, password: str | None = None, timeout: float = 30.0
    ) -> None:
        """``base_url`` may carry its user and password (``http://user:password@host:15672``); otherwise they come
        from ``user``/``password``, then ``$AMQP_EVENTS_MANAGEMENT_USER``/``$AMQP_EVENTS_MANAGEMENT_PASSWORD``,
        then RabbitMQ's ``guest`` (which it accepts from loopback only). Never the AMQP URL's: they are not sent
        over HTTP unless given for it."""
        parts = urllib.parse.urlsplit(base_url)
        if parts.username is not None:
            user, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
            parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
        user = user if user is not None else variable("AMQP_EVENTS_MANAGEMENT_USER") or "guest"
        password = password if password is not None else variable("AMQP_EVENTS_MANAGEMENT_PASSWORD") or "guest"
        self.base_url = urllib.parse.urlunsplit(parts).rstrip("/")
        self._authorization = "Basic " + b64encode(f"{user}:{password}".encode()).decode()
        self.timeout = timeout

    @classmethod
    def for_amqp_url(cls, amqp_url: str, management_port: int = 15672) -> ManagementAPI:
        """The management API beside an AMQP URL: its host, port 15672, the management API's own credentials."""
        return cls(f"http://{urllib.parse.urlsplit(amqp_url).hostname or 'localhost'}:{management_port}")

    def request(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", self._authorization)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            hint = (
                " (give the management API's user in the URL, http://USER:PASSWORD@host:15672, or as "
                "AMQP_EVENTS_MANAGEMENT_USER and AMQP_EVENTS_MANAGEMENT_PASSWORD)"
                if exc.code == 401
                else ""
            )
            raise ManagementError(
                f"{method} {self.base_url}{path}: HTTP {exc.code} {exc.read().decode(errors='replace')}{hint}"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ManagementError(f"cannot reach the management API at {self.base_url}: {exc}") from exc
        return json.loads(payload) if payload else None

    def create_vhost(self, vhost: str, user: str = "guest") -> None:
        """Create ``vhost`` and give ``user`` every permission on it."""
        quoted = _quote(vhost)
        self.request("PUT", f"/api/vhosts/{quoted}", {})
        self.request(
            "PUT",
            f"/api/permissions/{quoted}/{_quote(user)}",
            {"configure": ".*", "write": ".*", "read": ".*"},
        )

    def grant(self, vhost: str, user: str, grants: Grants, password: str | None = None) -> str:
        """Give ``user`` exactly ``grants`` on ``vhost`` (its permissions, then each topic permission, replacing
        what it had there), creating the user first (no tags) when it does not exist, with ``password``; an
        existing user's password is set to ``password`` when one is given (its tags kept). Returns what became
        of the user: ``created``, ``password set`` or ``kept``."""
        found = next((each for each in self.request("GET", "/api/users") if each.get("name") == user), None)
        if found is None and not password:
            raise ManagementError(f"user {user!r} does not exist: give its password to create it")
        done = "kept"
        if password:
            tags = found.get("tags", "") if found is not None else ""
            tags = ",".join(tags) if isinstance(tags, list) else str(tags)  # a list on 3.10, a list or text later
            self.request("PUT", f"/api/users/{_quote(user)}", {"password": password, "tags": tags})
            done = "created" if found is None else "password set"
        where = f"{_quote(vhost)}/{_quote(user)}"
        permissions = {"configure": grants.configure, "write": grants.write, "read": grants.read}
        self.request("PUT", f"/api/permissions/{where}", permissions)
        with contextlib.suppress(ManagementError):  # none yet: nothing to replace
            self.request("DELETE", f"/api/topic-permissions/{where}")
        for exchange, write, read in grants.topics:
            self.request("PUT", f"/api/topic-permissions/{where}", {"exchange": exchange, "write": write, "read": read})
        return done

    def delete_vhost(self, vhost: str) -> None:
        self.request("DELETE", f"/api/vhosts/{_quote(vhost)}")

    def queues(self, vhost: str, samples_for: int = 0) -> list[dict[str, Any]]:
        """The queues of ``vhost``; with ``samples_for`` seconds, each with its lengths and rates sampled over
        that time, a minute apart (``messages_details.samples``, ``message_stats.ack_details.samples``)."""
        query = f"?lengths_age={samples_for}&lengths_incr=60&msg_rates_age={samples_for}&msg_rates_incr=60"
        return list(self.request("GET", f"/api/queues/{_quote(vhost)}" + (query if samples_for else "")))

    def queue(self, vhost: str, name: str) -> dict[str, Any] | None:
        """One queue of ``vhost`` with its figures (as of the broker's last statistics, a few seconds old);
        ``None`` when there is none."""
        try:
            return dict(self.request("GET", f"/api/queues/{_quote(vhost)}/{_quote(name)}"))
        except ManagementError as exc:
            cause = exc.__cause__
            if isinstance(cause, urllib.error.HTTPError) and cause.code == 404:
                return None
            raise

    def exchanges(self, vhost: str) -> list[dict[str, Any]]:
        return list(self.request("GET", f"/api/exchanges/{_quote(vhost)}"))

    def bindings(self, vhost: str) -> list[dict[str, Any]]:
        return list(self.request("GET", f"/api/bindings/{_quote(vhost)}"))

    def version(self) -> str:
        """The RabbitMQ version of the node answering (``"4.0.5"``)."""
        return str(self.request("GET", "/api/overview").get("rabbitmq_version", ""))

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes, running or not (``name``, ``running``, ...)."""
        return list(self.request("GET", "/api/nodes"))


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def live_topology(management: ManagementAPI, vhost: str) -> LiveTopology:
    """What the management API reports for ``vhost``, to compare with a service's topology."""
    return LiveTopology(
        exchanges={item["name"]: item for item in management.exchanges(vhost) if item["name"]},
        queues={item["name"]: item for item in management.queues(vhost)},
        bindings={
            (item["source"], item["destination"], item["destination_type"], item["routing_key"])
            for item in management.bindings(vhost)
            if item["source"]  # every queue is bound to the default exchange: not ours to check
        },
        nodes=[item["name"] for item in management.nodes()],
        version=management.version(),
    )
