"""The Celery app class an events app is made of: its settings read once, its queue table, its worker's name
and log format.

Checked on Celery 5.5.3, 5.6.3 and 5.7.0 (tests/broker/test_celery_compat.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from celery import Celery
from celery.app.utils import Settings as CelerySettings
from celery.apps.worker import Worker
from celery.utils.log import task_logger
from celery.utils.nodenames import default_nodename, gethostname, host_format, nodename

from amqp_events.celery.host import Host
from amqp_events.celery.pool import ConsumingPool, chosen_by_default
from amqp_events.errors import SettingsFrozen, WorkerStartError
from amqp_events.middleware.logs import JsonFormatter
from amqp_events.settings import SETTING_PREFIX, raw_settings


class GuardedSettings(CelerySettings):  # type: ignore[misc]
    """Celery's ``app.conf``, refusing changes to ``amqp_events_*`` settings once the library read them.

    Upstream: ``app.conf`` is a ``celery.app.utils.Settings`` whose changes go
    through these methods (attribute writes included); ``config_from_object``
    builds a new one, checked by :meth:`EventsCelery._load_config`.
    """

    def __setitem__(self, key: str, value: Any) -> None:
        self.refuse_changes({key: value})
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> Any:
        self.refuse_changes(dict(*args, **kwargs))
        return super().update(*args, **kwargs)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self.refuse_changes({key: default})
        return super().setdefault(key, default)

    def pop(self, key: str, *default: Any) -> Any:
        self.refuse_changes({key: None})
        return super().pop(key, *default)

    def __delitem__(self, key: str) -> None:
        self.refuse_changes({key: None})
        super().__delitem__(key)

    def refuse_changes(self, changes: Mapping[str, Any]) -> None:
        frozen = self.__dict__.get("amqp_events_frozen")
        if frozen is None:
            return
        values, read_at = frozen
        changed = sorted(
            key for key, value in changes.items() if str(key).startswith(SETTING_PREFIX) and values.get(key) != value
        )
        if changed:
            raise SettingsFrozen(
                f"{', '.join(changed)} cannot change now: the app read its amqp_events_* settings {read_at}. "
                "Set them before that: in events_app(...), or in the configuration loaded when the app is made."
            )


def freeze(conf: Any, values: Mapping[str, Any], read_at: str) -> None:
    """From now on, changing any of ``values`` (the ``amqp_events_*`` settings as read) on ``conf`` raises."""
    if not isinstance(conf, GuardedSettings):
        object.__setattr__(conf, "__class__", GuardedSettings)  # its own __setattr__ would store a setting
    conf.__dict__["amqp_events_frozen"] = (dict(values), read_at)


class EventsWorker(Worker):  # type: ignore[misc]
    """Celery's worker, named after its service by default.

    Upstream: a worker started without ``-n`` is ``celery@<host>``, and its
    remote-control queue (``<name>.celery.pidbox``) is exclusive: a second
    worker on the host (another service, or more of the same) dies with
    ``RESOURCE_LOCKED``. Named ``<service>-<pid>@<host>``, every worker
    started as the documentation says gets a name of its own.
    """

    def __init__(self, app: Any = None, hostname: str | None = None, **kwargs: Any) -> None:
        # Upstream: ``celery worker`` passes its -n option, whose default is ``celery@<host>``.
        if not hostname or hostname == host_format(default_nodename(None)):
            hostname = nodename(f"{(app or self.app).service}-{os.getpid()}", gethostname())
        super().__init__(app=app, hostname=hostname, **kwargs)

    def setup_instance(self, *args: Any, **kwargs: Any) -> None:
        """``celery worker`` with no pool named runs the consuming pool (:mod:`amqp_events.celery.pool`).

        Upstream: ``setup_defaults`` runs twice (5.5: again from ``on_after_init``); the pool class is read here.
        """
        if chosen_by_default(self.app.conf):
            self.pool_cls = ConsumingPool
        if kwargs.get("autoscale") and self.pool_cls in (ConsumingPool, "amqp_events.celery.pool:ConsumingPool"):
            raise WorkerStartError(
                "--autoscale is not supported by the consuming pool (the default): give -c N, or -P prefork"
            )
        super().setup_instance(*args, **kwargs)  # the pool is made here, and started later
        if Host.of(self.pool).consumes_in_processes:  # each process it starts runs a worker with this one's options
            self.pool.worker = self

    def setup_logging(self, colorize: bool | None = None) -> Any:
        """With ``amqp_events_log_format = "json"``, every line the worker logs is a JSON object.

        Upstream: ``setup_logging`` installs the root logger's handlers and
        Celery's task logger's own (which does not propagate).
        """
        configured = super().setup_logging(colorize)
        if self.app.events_settings.log_format == "json":
            for logger in (logging.getLogger(), task_logger):
                for handler in logger.handlers:
                    handler.setFormatter(JsonFormatter())
        return configured


class EventsCelery(Celery):  # type: ignore[misc]
    """The Celery app class an events app is made of, with its adjustments."""

    #: Upstream: ``app.amqp`` is built from ``amqp_cls`` (see :class:`amqp_events.celery.queues.EventsAMQP`).
    amqp_cls = "amqp_events.celery.queues:EventsAMQP"
    _frozen: tuple[dict[str, Any], str] | None = None

    @cached_property
    def Worker(self) -> Any:  # Celery's name
        """Upstream: ``celery worker`` makes its worker with ``app.Worker(hostname=...)``."""
        return self.subclass_with_self(EventsWorker)

    def freeze_settings(self, values: Mapping[str, Any], read_at: str) -> None:
        """Refuse later changes to ``values``, the ``amqp_events_*`` settings as they were read."""
        self._frozen = (dict(values), read_at)
        freeze(self.conf, values, read_at)

    def _load_config(self) -> Any:
        # Upstream: a configuration loaded after the app was configured (config_from_object) replaces
        # app.conf with a new object. Keep guarding it, and refuse it if it changes settings already read.
        conf = super()._load_config()
        if self._frozen is not None:
            freeze(conf, *self._frozen)
            conf.refuse_changes(raw_settings(conf))
        return conf


#: URL schemes of RabbitMQ for kombu: the library builds on RabbitMQ's quorum queues, dead-lettering and TTLs
#: (and kombu's in-memory transport, for an app in a test that never connects).
RABBITMQ_SCHEMES = ("amqp", "amqps", "pyamqp", "memory")


def check_broker_url(url: Any) -> None:
    """Refuse a broker other than RabbitMQ (kombu would fail later, with a message that names nothing of it)."""
    scheme = str(url or "amqp").partition("://")[0].partition("+")[0].lower()
    if scheme not in RABBITMQ_SCHEMES:
        raise ValueError(
            f"broker_url {scheme}://...: celery-amqp-events runs on RabbitMQ only (amqp:// or amqps://); "
            "its retries, archive and topology are RabbitMQ queues and exchanges"
        )
