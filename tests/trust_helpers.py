"""Services under RabbitMQ users of their own, as `amqp-events topology permissions` grants them, and what another
service's user can publish with any client: what the trust-boundary tests share."""

from __future__ import annotations

import json
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kombu import Connection


def user_url(broker_url: str, user: str, password: str) -> str:
    parts = urllib.parse.urlsplit(broker_url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


@contextmanager
def users_of(
    rabbitmq: Any, broker_url: str, cli_process: Callable[..., Any], services: tuple[str, ...], env: dict[str, str]
) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """A user per service of ``services`` (named otherwise than its service, mapped by
    ``AMQP_EVENTS_SERVICE_USERS``), created and granted by `topology permissions --apply` (the printed rabbitmqctl
    commands are run as printed in test_least_privilege.py), after an administrator declared each service's
    topology: ``(urls by service, the fleet's environment)``."""
    users = {service: (f"{service}-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex) for service in services}
    fleet = {"AMQP_EVENTS_SERVICE_USERS": ",".join(f"{user}={service}" for service, (user, _) in users.items()), **env}
    made = []
    try:
        for service, (user, password) in users.items():
            declared = cli_process("topology", "declare", app=f"services.{service}", env=fleet)
            assert declared.returncode == 0, declared.stderr
            applied = cli_process(
                "topology", "permissions", "--user", user, "--apply", "--password-env", "SERVICE_PASSWORD",
                app=f"services.{service}", env={**fleet, "SERVICE_PASSWORD": password},
            )  # fmt: skip
            assert applied.returncode == 0, applied.stderr
            made.append(user)
        yield {service: user_url(broker_url, *user) for service, user in users.items()}, fleet
    finally:
        for user in made:
            rabbitmq.management.request("DELETE", f"/api/users/{urllib.parse.quote(user, safe='')}")


def raw(
    url: str,
    exchange: str,
    routing_key: str,
    headers: dict[str, Any],
    body: Any,
    signed: bool = True,
    **properties: Any,
) -> Callable[[], None]:
    """A publish as the user of ``url`` could make it with any client, confirmed; ``signed``: with its ``user_id``
    (the broker verifies it), as the library sends, or without (nothing verified); ``properties``: AMQP
    properties such as ``expiration``."""

    def publish() -> None:
        with Connection(url, transport_options={"confirm_publish": True}) as connection:
            channel = connection.default_channel
            payload = body if isinstance(body, bytes) else json.dumps(body).encode()
            given = {**({"user_id": connection.userid} if signed else {}), **properties}
            message = channel.prepare_message(payload, None, "application/json", "utf-8", headers, given)
            channel.basic_publish(message, exchange=exchange, routing_key=routing_key)

    return publish
