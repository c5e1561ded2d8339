"""Every environment variable the library reads, in one table, and the one function that reads them.

An app's settings come first from ``events_app(...)`` and ``app.conf``; the variables marked as settings
(:data:`amqp_events.settings.ENVIRONMENT` says which setting each fills) are read when an app is made. The
others configure the operator's tools: the management API client, the console's credentials, the local
development broker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Name -> what it gives.
VARIABLES: dict[str, str] = {
    "AMQP_EVENTS_BROKER_URL": "the setting broker_url of an app made without one (`amqp-events broker start` "
    "prints it)",
    "AMQP_EVENTS_MAX_RETRIES": "the setting amqp_events_max_retries",
    "AMQP_EVENTS_ARCHIVED_MESSAGE_TTL": "the setting amqp_events_archive_ttl_ms",
    "AMQP_EVENTS_ARCHIVED_QUEUE_LENGTH": "the setting amqp_events_archive_max_length",
    "AMQP_EVENTS_METRICS_PORT": "the setting amqp_events_metrics_port",
    "AMQP_EVENTS_HEALTH_PORT": "the setting amqp_events_health_port (the worker's /livez and /readyz)",
    "AMQP_EVENTS_HEALTH_HOST": "the setting amqp_events_health_host (0.0.0.0 where a probe comes from outside)",
    "AMQP_EVENTS_SHARED_TOPOLOGY": "the setting amqp_events_shared_topology (set by an administrator where the "
    "shared topology is declared for the services)",
    "AMQP_EVENTS_QUORUM_QUEUE_WARNING": "the setting amqp_events_quorum_queue_warning (where `topology check` and "
    "the exporter warn)",
    "AMQP_EVENTS_QUEUE_LAYOUT": "the setting amqp_events_queue_layout (per_handler or per_service)",
    "AMQP_EVENTS_DELAY_LADDER": "the setting amqp_events_delay_ladder (per_service or shared)",
    "AMQP_EVENTS_SERVICE_USERS": "the setting amqp_events_service_users: user=service, comma-separated",
    "AMQP_EVENTS_TRUSTED_USERS": "the setting amqp_events_trusted_users: users, comma-separated",
    "AMQP_EVENTS_EVENT_OWNERSHIP": "the setting amqp_events_event_ownership (1 or true: on)",
    "AMQP_EVENTS_EVENT_OWNERS": "the setting amqp_events_event_owners: pattern=service, comma-separated",
    "AMQP_EVENTS_MANAGEMENT_URL": "where the command line finds RabbitMQ's management API (its --management-url)",
    "AMQP_EVENTS_MANAGEMENT_USER": "the management API's user (default guest)",
    "AMQP_EVENTS_MANAGEMENT_PASSWORD": "the management API's password (default guest)",
    "AMQP_EVENTS_CONSOLE_USERS": "the console's users: name:role:hash, comma-separated",
    "AMQP_EVENTS_CONSOLE_TOKEN": "a bearer token of the console's operator role, for scripts",
    "AMQP_EVENTS_CONSOLE_READ_TOKEN": "a bearer token of the console's read-only role",
    "AMQP_EVENTS_CONSOLE_AUDIT_FILE": "the file the console keeps its event log in (its --audit-file)",
    "AMQP_EVENTS_RABBITMQ": "the RabbitMQ line (3.10 or 4.0) `amqp-events broker start` and the test suite run",
    "AMQP_EVENTS_RABBITMQ_ROOTS": "where `amqp-events broker install` keeps the other RabbitMQ lines",
    "AMQP_EVENTS_STARTED": "a directory where the local servers and test workers started are written down, to be "
    "stopped by PID when `scripts/test` ends",
}


def variable(name: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The value of ``name`` (one of :data:`VARIABLES`), without surrounding blanks; None when unset or empty."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of the library's environment variables (amqp_events.environment)")
    return environ.get(name, "").strip() or None
