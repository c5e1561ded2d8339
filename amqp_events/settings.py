"""Settings of the library: Celery defaults, our own ``amqp_events_*`` keys and environment variables.

Everything here is plain data; :func:`amqp_events.celery.events_app` applies it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from amqp_events.environment import variable

#: An event key falls into one of this many slots (:func:`amqp_events.topology.names.slot_of`).
KEY_SLOTS = 64

#: Celery settings ``events_app`` applies before the caller's own (SPEC "safe defaults").
CELERY_DEFAULTS: dict[str, Any] = {
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    "task_acks_on_failure_or_timeout": False,
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    "result_accept_content": ["json"],
    "result_backend": None,
    "task_ignore_result": True,
    "broker_transport_options": {"confirm_publish": True},
    "broker_connection_retry_on_startup": True,
    "worker_consumer": "amqp_events.celery.consumer:EventConsumer",
    # Measured in bench/: quorum queues deliver slowly with a small prefetch window
    # (solo: ~2,200 events/s at 4, ~3,400/s at 16, no gain beyond).
    "worker_prefetch_multiplier": 16,
}

#: Where a service's events wait: the setting, and its values.
QUEUE_LAYOUT = "amqp_events_queue_layout"
QUEUE_LAYOUTS = ("per_handler", "per_service")
#: Where a service's own waits wait: the setting's values.
DELAY_LADDERS = ("per_service", "shared")
#: Environment variables read when an app is created (of :data:`amqp_events.environment.VARIABLES`): the
#: setting each one fills, and its type.
ENVIRONMENT: dict[str, tuple[str, str]] = {
    "AMQP_EVENTS_BROKER_URL": ("broker_url", "str"),
    "AMQP_EVENTS_MAX_RETRIES": ("amqp_events_max_retries", "int"),
    "AMQP_EVENTS_ARCHIVED_MESSAGE_TTL": ("amqp_events_archive_ttl_ms", "int"),
    "AMQP_EVENTS_ARCHIVED_QUEUE_LENGTH": ("amqp_events_archive_max_length", "int"),
    "AMQP_EVENTS_METRICS_PORT": ("amqp_events_metrics_port", "int"),
    "AMQP_EVENTS_HEALTH_PORT": ("amqp_events_health_port", "int"),
    "AMQP_EVENTS_HEALTH_HOST": ("amqp_events_health_host", "str"),
    "AMQP_EVENTS_SHARED_TOPOLOGY": ("amqp_events_shared_topology", "str"),
    "AMQP_EVENTS_QUORUM_QUEUE_WARNING": ("amqp_events_quorum_queue_warning", "int"),
    "AMQP_EVENTS_QUEUE_LAYOUT": (QUEUE_LAYOUT, "str"),
    "AMQP_EVENTS_DELAY_LADDER": ("amqp_events_delay_ladder", "str"),
    "AMQP_EVENTS_SERVICE_USERS": ("amqp_events_service_users", "table"),
    "AMQP_EVENTS_TRUSTED_USERS": ("amqp_events_trusted_users", "list"),
    "AMQP_EVENTS_EVENT_OWNERSHIP": ("amqp_events_event_ownership", "bool"),
    "AMQP_EVENTS_EVENT_OWNERS": ("amqp_events_event_owners", "table"),
}

SETTING_PREFIX = "amqp_events_"
HISTORY = "amqp_events_history"
#: What a dict given as ``amqp_events_history`` may set.
HISTORY_RETENTION = ("max_age", "max_bytes", "segment_bytes")
BREAKER = "amqp_events_breaker"
#: What a dict given as ``amqp_events_breaker`` may set (the fields of ``breakers.BreakerPolicy``, which checks
#: their values when a worker makes its breakers).
BREAKER_POLICY = (
    "failures", "window", "ratio", "min_messages", "open_for", "growth", "open_max", "escalate_after",
    "escalate_window", "calm_after",
)  # fmt: skip
_MAX_AGE = re.compile(r"^[1-9][0-9]*[YMDhms]$")


@dataclass(frozen=True)
class Settings:
    """The library's own settings, read from Celery's ``app.conf`` as ``amqp_events_<field>``."""

    #: Topic exchange every service fires events to.
    exchange: str = "events"
    #: Who declares what every service on the vhost shares (the events exchange, the delay ladder, the heartbeats
    #: and delivery exchanges, the history stream): "declare" (each worker and producer, idempotent: its user
    #: needs configure rights on them) or "check" (an administrator declared them with ``amqp-events topology
    #: declare``; workers and producers only check that they are there, and a service's user needs rights on its
    #: own queues alone: ``amqp-events topology permissions``).
    shared_topology: str = "declare"
    #: Retries after the first attempt before a failing message is archived.
    max_retries: int = 10
    #: First retry delay in seconds; attempt ``k`` waits ``backoff_base * 2**(k-1)``.
    backoff_base: float = 1.0
    #: Longest backoff delay in seconds.
    backoff_max: float = 3600.0
    #: Randomise each backoff delay between half and all of its value.
    backoff_jitter: bool = False
    #: Times the pool process running a message may die (SIGKILL, OOM) before it is archived as
    #: ``worker_lost``; counted exactly by the worker's main process.
    max_deliveries: int = 3
    #: Times the broker may get a message back without an outcome (the whole worker died or stopped
    #: holding it, prefetched or running) before it is archived as ``worker_lost``.
    max_redeliveries: int = 10
    #: Nodes each quorum queue is replicated to when it is created (as many as the cluster has, up to this);
    #: 0 leaves it to the broker's default.
    quorum_group_size: int = 3
    #: Archive message TTL in milliseconds; 0 keeps messages until replayed or purged.
    archive_ttl_ms: int = 7 * 24 * 3600 * 1000
    #: Archive length bound; 0 means unbounded. The oldest messages go first.
    archive_max_length: int = 10_000
    #: Seconds firing an event may take (connecting, confirming) before it raises.
    publish_timeout: float = 10.0
    #: Port of the worker's Prometheus endpoint; 0 serves none.
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    #: Distinct exception class names per handler in metric labels; the rest are counted as "other".
    metrics_exception_labels: int = 10
    #: Port of the worker's health probes (``/livez``, ``/readyz``: docs/guides/production.md); 0 serves none.
    health_port: int = 0
    health_host: str = "127.0.0.1"
    #: Seconds the worker's event loop may not turn before ``/livez`` fails (a solo worker's loop runs its
    #: handlers: allow the longest).
    health_stall: float = 60.0
    #: Seconds between a worker's heartbeats (read by ``amqp-events exporter``).
    heartbeat_interval: float = 5.0
    #: The database of the transactional outbox (a SQLAlchemy URL). Empty: for the in-process relay, the
    #: database of the first outbox write; for ``amqp-events outbox``, a SQLite file next to the app.
    outbox_url: str = ""
    #: Name (and schema, empty: the default one) of the outbox table.
    outbox_table: str = "amqp_events_outbox"
    outbox_schema: str = ""
    #: Run a relay in a thread of the app's process, woken after each commit that wrote events.
    outbox_relay: bool = False
    #: Rows a relay claims and publishes at a time.
    outbox_batch: int = 500
    #: Seconds a relay holds the rows it claimed; another relay takes them over after that.
    outbox_lease: float = 30.0
    #: Seconds between looks at the table when nothing wakes the relay (PostgreSQL relays LISTEN).
    outbox_poll_interval: float = 1.0
    #: Failed attempts to publish a row before it is set aside as dead.
    outbox_max_attempts: int = 10
    #: Seconds an inbox keeps the key of a handled event: a duplicate arriving later runs again. It must
    #: outlast the archive's TTL plus the retry delays (a warning says so when it does not).
    inbox_retention: float = 14 * 24 * 3600.0
    #: Seconds between a worker's prunings of its handlers' inboxes.
    inbox_prune_interval: float = 600.0
    #: With tracing on: each handler attempt's span is a child of the firing span (one trace per event)
    #: instead of a new trace that links to it.
    trace_as_child: bool = False
    #: Format of a worker's log lines: "text" (Celery's) or "json" (one JSON object per line, with the
    #: event's fields).
    log_format: str = "text"
    #: At ``-l info``, Celery's ``Task NAME[ID] received`` and ``succeeded in`` lines for each run, as Celery's own
    #: request path logs them (False: left out, where a line per run costs more than the run; at ``-l warning``,
    #: Celery's default, they cost nothing).
    log_runs: bool = True
    #: How this service fires events: "celery" (Celery's task message, the default) or "cloudevents"
    #: (CloudEvents binary mode, ``ce-`` headers: for consumers in other languages). Workers read both.
    wire_format: str = "celery"
    #: Queues a service's ordered handlers (``ordered_by``) share, each consumed by one worker at a time; keys
    #: fall into :data:`KEY_SLOTS` slots, shared out over them. Changing it moves keys between queues.
    partitions: int = 8
    #: Keep every fired event in the vhost's history stream (``amqp_events.history``), which ``amqp-events
    #: history`` searches and replays. ``amqp_events_history`` may also be a dict of the three retention
    #: settings below without their prefix: ``{"max_age": "30D", "max_bytes": 50 * 1024**3}``.
    history: bool = False
    #: How long the history keeps an event: a number and one of ``Y M D h m s`` (RabbitMQ's ``x-max-age``).
    history_max_age: str = "7D"
    #: Bytes the history may take (each replica, on disk) before its oldest segment goes; 0: no bound but the age.
    history_max_bytes: int = 10 * 1024**3
    #: Bytes of one segment file: retention drops whole segments, so old events go in steps of this size.
    history_segment_bytes: int = 100 * 1024**2
    #: ``topology check`` and the exporter warn when the vhost holds more quorum queues than this (each costs every
    #: node memory, idle CPU and restart time: the reference on topology, sizing); 0: never.
    quorum_queue_warning: int = 4000
    #: Where the service's handlers' events wait: ``per_handler``, a quorum queue per handler; ``per_service``,
    #: one quorum queue ``<service>.events`` for all of them (ordered handlers keep their partitions). Each
    #: handler keeps its own retries, archive entries and breaker either way (docs/reference/topology.md).
    queue_layout: str = "per_handler"
    #: Messages one worker process holds unacked at most, all its queues together: each consumer gets its share
    #: (at least one per pool process), so that a service with many handlers does not have each worker hold
    #: ``worker_prefetch_multiplier`` messages per queue.
    worker_prefetch_limit: int = 256
    #: Coroutine handlers (``async def``) in flight at once in a worker process with the solo or threads pool
    #: (each waiting on I/O costs a few KB); the worker's prefetch is raised to at least this to keep them busy.
    async_concurrency: int = 100
    #: Seconds a warm shutdown lets running coroutine handlers finish; the rest are cancelled and their messages
    #: go back to the broker unacked (to run again).
    async_shutdown_timeout: float = 30.0
    #: A breaker for every handler of the service that does not say otherwise (``@app.handler(breaker=...)``):
    #: True (the default policy) or a dict of the policy's fields (``failures``, ``window``, ``open_for``, ...);
    #: None: only the handlers that ask for one have a breaker.
    breaker: Mapping[str, Any] | bool | None = None
    #: Seconds at a time an event of a paused handler waits on the broker when the handler shares its queue
    #: (``per_service``): one publish per wait; after it resumes, its events come back within this long.
    paused_wait: int = 30
    #: RabbitMQ users whose name is not their service's: ``{"billing-prod": "billing"}``. The broker verifies the
    #: user of every message (its ``user_id``); the service that user stands for is the event's author
    #: (``current_event().fired_by``). The same table in every service.
    service_users: Mapping[str, str] = field(default_factory=dict)
    #: Users other than the service's own whose copies it takes as its own (an administrator's console replaying
    #: its archive): such a copy keeps its author and the handler it names.
    trusted_users: tuple[str, ...] = ()
    #: Each event belongs to one service, which alone may fire it: the service its first word names, unless
    #: ``event_owners`` says otherwise. A worker then archives (reason ``not_owner``) an event whose verified
    #: author is not its owner, and ``topology permissions`` prints topic permissions that keep each service to
    #: its own events. Needs a RabbitMQ user per service.
    event_ownership: bool = False
    #: Events owned by another service than their first word names: ``{"user.#": "accounts"}`` (topic patterns,
    #: the first that matches wins). The same table in every service.
    event_owners: Mapping[str, str] = field(default_factory=dict)
    #: Bytes of a message body (decompressed) a worker takes: a larger one is archived (``too_large``), its body
    #: cut to its first bytes with its size and SHA-256 recorded. RabbitMQ 4.0's own default bound.
    max_body_bytes: int = 16 * 1024 * 1024
    #: Bytes each queue of a delay ladder and the unroutable queue hold at most: past it the broker refuses a
    #: publish (the publisher gets a nack; a refused retry is archived, ``delay_refused``) instead of dropping
    #: what it holds.
    shared_queue_max_bytes: int = 1024**3
    #: Where the service's own waits (its retries, a lost run's or a paused handler's copies) wait:
    #: ``"per_service"``, in a delay ladder of its own (``<service>.delay.NN``, 22 quorum queues), which no other
    #: service can fill or slow; ``"shared"``, in the vhost's shared ladder (no queues of its own; another
    #: service filling a level there makes the broker refuse these retries, archived as ``delay_refused``).
    #: Events fired with a delay, and a received message's ``eta``, wait in the shared ladder either way.
    delay_ladder: str = "per_service"
    #: Flow control's keys (``concurrency_key=``, ``rate_limit_key=``) share this many sets of leases and windows
    #: per handler: however many keys senders choose, the broker holds at most this many windows for a handler; two
    #: keys of one set share its limit (a stricter limit, never a looser one).
    limit_keys: int = 256

    @property
    def checks_shared_topology(self) -> bool:
        """Does this app only check the shared topology (declared by an administrator)?"""
        return self.shared_topology == "check"

    def __post_init__(self) -> None:
        problems = []
        if self.max_retries < 0:
            problems.append(f"max_retries must be >= 0, not {self.max_retries}")
        if self.backoff_base <= 0 or self.backoff_max < self.backoff_base:
            problems.append(f"need 0 < backoff_base <= backoff_max, got {self.backoff_base} and {self.backoff_max}")
        if self.max_deliveries < 1 or self.max_redeliveries < 1:
            problems.append("max_deliveries and max_redeliveries must be >= 1")
        if self.quorum_group_size < 0:
            problems.append("quorum_group_size must be >= 0 (0: the broker's default)")
        if self.archive_ttl_ms < 0 or self.archive_max_length < 0:
            problems.append("archive limits must be >= 0 (0 means unbounded)")
        if self.publish_timeout <= 0:
            problems.append("publish_timeout must be > 0")
        if self.health_stall <= 0:
            problems.append("health_stall must be > 0")
        if self.heartbeat_interval <= 0:
            problems.append("heartbeat_interval must be > 0")
        if self.outbox_batch < 1 or self.outbox_max_attempts < 1:
            problems.append("outbox_batch and outbox_max_attempts must be >= 1")
        if self.outbox_lease <= 0 or self.outbox_poll_interval <= 0:
            problems.append("outbox_lease and outbox_poll_interval must be > 0")
        if self.inbox_retention <= 0 or self.inbox_prune_interval <= 0:
            problems.append("inbox_retention and inbox_prune_interval must be > 0")
        if self.quorum_queue_warning < 0:
            problems.append("quorum_queue_warning must be >= 0 (0: never)")
        if self.worker_prefetch_limit < 1:
            problems.append("worker_prefetch_limit must be >= 1")
        if self.async_concurrency < 1 or self.async_shutdown_timeout < 0:
            problems.append("async_concurrency must be >= 1 and async_shutdown_timeout >= 0")
        if self.max_body_bytes < 1024 or self.shared_queue_max_bytes < 1:
            problems.append("max_body_bytes must be >= 1024 and shared_queue_max_bytes >= 1")
        problems.extend(_table_problems("service_users", self.service_users))
        problems.extend(_table_problems("event_owners", self.event_owners))
        if self.paused_wait < 1:
            problems.append("paused_wait must be >= 1 (seconds)")
        if self.limit_keys < 1:
            problems.append(f"limit_keys must be >= 1, not {self.limit_keys}")
        if self.delay_ladder not in DELAY_LADDERS:
            problems.append(f"delay_ladder must be one of {', '.join(DELAY_LADDERS)}, not {self.delay_ladder!r}")
        if self.queue_layout not in QUEUE_LAYOUTS:
            problems.append(f"queue_layout must be one of {', '.join(QUEUE_LAYOUTS)}, not {self.queue_layout!r}")
        if self.log_format not in ("text", "json"):
            problems.append(f"log_format must be 'text' or 'json', not {self.log_format!r}")
        if self.shared_topology not in ("declare", "check"):
            problems.append(f"shared_topology must be 'declare' or 'check', not {self.shared_topology!r}")
        if self.wire_format not in ("celery", "cloudevents"):
            problems.append(f"wire_format must be 'celery' or 'cloudevents', not {self.wire_format!r}")
        if not 1 <= self.partitions <= KEY_SLOTS:
            problems.append(f"partitions must be between 1 and {KEY_SLOTS} (the key slots), not {self.partitions}")
        if not _MAX_AGE.match(self.history_max_age):
            problems.append(
                f"history_max_age must be a number and one of Y M D h m s (like 7D), not {self.history_max_age!r}"
            )
        if self.history_max_bytes < 0 or self.history_segment_bytes < 1:
            problems.append("history_max_bytes must be >= 0 (0: no bound) and history_segment_bytes >= 1")
        problems.extend(_breaker_problems(self.breaker))
        if problems:
            raise ValueError("invalid amqp_events settings: " + "; ".join(problems))

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> Settings:
        """The settings in ``conf`` (Celery's ``app.conf``), defaults for those not given."""
        return cls.from_raw(raw_settings(conf))

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> Settings:
        """The settings from :func:`raw_settings` values (``None``: not given)."""
        values: dict[str, Any] = {}
        raw = _with_history_expanded(raw)
        for setting in fields(cls):
            key = SETTING_PREFIX + setting.name
            if raw.get(key) is None:
                continue
            given = raw[key]
            if key == BREAKER or str(setting.type).startswith("Mapping"):  # checked by __post_init__, read-only
                values[setting.name] = MappingProxyType(dict(given)) if isinstance(given, Mapping) else given
            elif str(setting.type).startswith("tuple"):
                values[setting.name] = (given,) if isinstance(given, str) else tuple(given)
            else:
                values[setting.name] = _coerce(setting.type, given, key)
        return cls(**values)


def _breaker_problems(breaker: Any) -> list[str]:
    if breaker is None or isinstance(breaker, bool):
        return []
    if not isinstance(breaker, Mapping):
        return [f"breaker must be True, False or a dict of {', '.join(BREAKER_POLICY)}, not {breaker!r}"]
    unknown = sorted(map(str, set(breaker) - set(BREAKER_POLICY)))
    return [f"breaker has unknown key(s) {', '.join(unknown)}: it takes {', '.join(BREAKER_POLICY)}"] if unknown else []


def _table_problems(name: str, table: Any) -> list[str]:
    if not isinstance(table, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
        return [f"{name} must be a dict of strings to strings, not {table!r}"]
    return []


def _with_history_expanded(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """``amqp_events_history`` given as a dict: history on, with the retention settings it names."""
    given = raw.get(HISTORY)
    if not isinstance(given, Mapping):
        return raw
    unknown = set(given) - set(HISTORY_RETENTION)
    if unknown:
        raise ValueError(
            f"{HISTORY} has unknown key(s) {', '.join(sorted(map(str, unknown)))}: "
            f"it takes {', '.join(HISTORY_RETENTION)}"
        )
    return {**raw, HISTORY: True, **{f"{HISTORY}_{name}": value for name, value in given.items()}}


def raw_settings(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Every ``amqp_events_*`` key of :class:`Settings` with its value in ``conf``, as given."""
    return {SETTING_PREFIX + setting.name: conf.get(SETTING_PREFIX + setting.name) for setting in fields(Settings)}


def environment_defaults(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """App settings given by the documented environment variables."""
    found = {}
    for name, (key, kind) in ENVIRONMENT.items():
        raw = variable(name, environ)
        if raw is not None:
            found[key] = _coerce(kind, raw, name)
    return found


def _coerce(kind: Any, value: Any, name: str) -> Any:
    converters: dict[str, Callable[[Any], Any]] = {
        "int": int, "float": float, "str": str, "bool": _to_bool, "table": _to_table, "list": _to_list,
    }  # fmt: skip
    try:
        return converters[str(kind)](value)
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{name} must be of type {kind}, got {value!r}") from None


def _to_table(value: str) -> dict[str, str]:
    """``"billing-prod=billing, user.#=accounts"``: an environment variable's table."""
    pairs = [item.partition("=") for item in value.split(",") if item.strip()]
    if any(not sep or not key.strip() or not name.strip() for key, sep, name in pairs):
        raise ValueError(value)
    return {key.strip(): name.strip() for key, _, name in pairs}


def _to_list(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _to_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def longest_life_of_a_duplicate(settings: Settings) -> float:
    """Seconds a duplicate of a handled event may still turn up: every retry delay, then the archive's TTL."""
    return settings.max_retries * settings.backoff_max + settings.archive_ttl_ms / 1000
