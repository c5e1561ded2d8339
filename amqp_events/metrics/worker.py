"""The worker's side of monitoring: a ``/metrics`` endpoint and heartbeats.

* With ``amqp_events_metrics_port`` set, the worker's main process serves the
  handler metrics of :mod:`amqp_events.metrics` on that port (host
  ``amqp_events_metrics_host``, 127.0.0.1 by default). Pool children write to
  files in ``$PROMETHEUS_MULTIPROC_DIR`` (made for the worker when unset, removed
  when it stops) and the endpoint serves their sum, so prefork workers report
  every child.
* Every ``amqp_events_heartbeat_interval`` seconds the worker publishes a
  small heartbeat to the ``amqp_events.heartbeats`` fanout exchange, and an
  ``offline`` one when it stops; ``amqp-events exporter`` turns them into
  workers-up metrics.
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

from amqp_events.metrics import AVAILABLE
from amqp_events.topology import heartbeats_exchange

logger = logging.getLogger("amqp_events")

HEARTBEATS = heartbeats_exchange()
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The metrics directory this worker made for itself (removed when it stops), if it made one.
made_dir: str | None = None


@signals.worker_init.connect
def serve_metrics(sender: Any = None, **_: Any) -> None:
    """Start the metrics endpoint before the pool forks (a no-op unless the app asks for one)."""
    app = getattr(sender, "app", None)
    settings = getattr(app, "events_settings", None)
    if settings is None or not settings.metrics_port:
        return
    if not AVAILABLE:
        logger.error("amqp_events_metrics_port is set but prometheus-client is not installed: pip install '.[metrics]'")
        return
    if MULTIPROC_ENV not in os.environ:
        if "prometheus_client" in sys.modules:
            logger.warning(
                "prometheus_client was imported before the worker started: pool children's metrics are only "
                "collected when %s is set in the worker's environment",
                MULTIPROC_ENV,
            )
        else:
            global made_dir
            made_dir = os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="amqp-events-metrics-")
    else:
        _clear(os.environ[MULTIPROC_ENV])  # files of a previous run would add up with this one's
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    registry: Any = None
    if MULTIPROC_ENV in os.environ:
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
    start_http_server(settings.metrics_port, settings.metrics_host, **({"registry": registry} if registry else {}))
    logger.info("serving metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)


@signals.worker_process_shutdown.connect
def forget_child(pid: int | None = None, **_: Any) -> None:
    """A pool child ended: its in-progress gauge must not count any more."""
    if AVAILABLE and pid and MULTIPROC_ENV in os.environ and "prometheus_client" in sys.modules:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


@signals.worker_shutdown.connect
def remove_made_dir(**_: Any) -> None:
    """The worker's main process stops: remove the metrics directory it made for itself, if it did."""
    if made_dir is not None:
        shutil.rmtree(made_dir, ignore_errors=True)


def _clear(directory: str) -> None:
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                os.unlink(path)
            else:
                shutil.rmtree(path, ignore_errors=True)


class Heartbeat(bootsteps.StartStopStep):
    """Consumer step: announce this worker every few seconds on ``amqp_events.heartbeats``."""

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
        body = {"service": c.app.service, "worker": c.hostname, "state": state, "time": time.time()}
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
