"""The worker's side of monitoring: a ``/metrics`` endpoint and heartbeats, as Celery bootsteps.

``events_app`` adds both steps to its app (``app.steps``), so they run in
workers of that app only, with nothing connected at import time.

* :class:`MetricsEndpoint` (worker step): with ``amqp_events_metrics_port``
  set, the worker's main process serves the handler metrics of
  :mod:`amqp_events.metrics` on that port (host ``amqp_events_metrics_host``).
  Pool children write to files in ``$PROMETHEUS_MULTIPROC_DIR`` (made for the
  worker when unset, and removed when it stops) and the endpoint serves their
  sum, so prefork workers report every child. Setting that variable is the
  one write to ``os.environ`` the library makes, before the pool forks.
* :class:`Heartbeat` (consumer step): every ``amqp_events_heartbeat_interval``
  seconds the worker publishes a small heartbeat to the
  ``amqp_events.heartbeats`` fanout exchange, and an ``offline`` one when it
  stops; ``amqp-events exporter`` turns them into workers-up metrics.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from celery import bootsteps, signals
from kombu import Producer

from amqp_events.breakers import breakers_of
from amqp_events.metrics import AVAILABLE
from amqp_events.topology import heartbeats_exchange

logger = logging.getLogger(__name__)

HEARTBEATS = heartbeats_exchange()
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class MetricsEndpoint(bootsteps.StartStopStep):  # type: ignore[misc]
    """Worker step: serve ``/metrics`` from the main process (started before the pool forks)."""

    label = "amqp-events metrics endpoint"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.server: Any = None
        self.made_dir: str | None = None
        settings = parent.app.events_settings
        if not settings.metrics_port:
            return
        if not AVAILABLE:
            logger.error(
                "amqp_events_metrics_port is set but prometheus-client is not installed: pip install '.[metrics]'"
            )
            return
        self._use_multiprocess_dir()
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        registry: Any = None
        if MULTIPROC_ENV in os.environ:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
        served = start_http_server(
            settings.metrics_port, settings.metrics_host, **({"registry": registry} if registry else {})
        )
        self.server = served[0] if isinstance(served, tuple) else None
        signals.worker_process_shutdown.connect(forget_child)
        logger.info("serving metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)

    def _use_multiprocess_dir(self) -> None:
        if MULTIPROC_ENV in os.environ:
            _clear(os.environ[MULTIPROC_ENV])  # files of a previous run would add up with this one's
        elif "prometheus_client" in sys.modules:
            logger.warning(
                "prometheus_client was imported before the worker started: pool children's metrics are only "
                "collected when %s is set in the worker's environment",
                MULTIPROC_ENV,
            )
        else:
            self.made_dir = os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="amqp-events-metrics-")

    def start(self, parent: Any) -> None:
        pass

    def stop(self, parent: Any) -> None:
        signals.worker_process_shutdown.disconnect(forget_child)
        if self.server is not None:
            self.server.shutdown()
            self.server = None
        if self.made_dir is not None:
            shutil.rmtree(self.made_dir, ignore_errors=True)
            self.made_dir = None

    terminate = shutdown = stop


def forget_child(pid: int | None = None, **_: Any) -> None:
    """A pool child ended: its in-progress gauge must not count any more."""
    if pid and MULTIPROC_ENV in os.environ and "prometheus_client" in sys.modules:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def _clear(directory: str) -> None:
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                os.unlink(path)
            else:
                shutil.rmtree(path, ignore_errors=True)


class Heartbeat(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer step: announce this worker every few seconds on ``amqp_events.heartbeats``."""

    label = "amqp-events heartbeat"
    requires = ("celery.worker.consumer.connection:Connection",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        self.timer_entry: Any = None
        self.producer: Producer | None = None
        super().__init__(parent, **kwargs)

    def start(self, c: Any) -> None:
        interval = c.app.events_settings.heartbeat_interval
        channel = c.connection.channel()
        HEARTBEATS.declare(channel=channel)
        self.producer = Producer(channel, exchange=HEARTBEATS)
        self.beat(c, "online")
        self.timer_entry = c.timer.call_repeatedly(interval, self.beat, (c, "online"))

    def stop(self, c: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None
        if self.producer is not None:
            self.beat(c, "offline")
            self.producer = None

    shutdown = stop

    def beat(self, c: Any, state: str) -> None:
        if self.producer is None:
            return
        interval = c.app.events_settings.heartbeat_interval
        body: dict[str, Any] = {"service": c.app.service, "worker": c.hostname, "state": state, "time": time.time()}
        breakers = breakers_of(c.app)
        if breakers is not None:
            body["breakers"], body["health"] = breakers.states(), breakers.health()
        try:
            self.producer.publish(
                json.dumps(body),
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=1,
                expiration=3 * interval,
            )
        except Exception as exc:  # a heartbeat must never stop the worker
            logger.debug("heartbeat not sent: %s", exc)
