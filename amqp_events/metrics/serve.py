"""Serving a worker's metrics: a ``/metrics`` endpoint in its main process, summing its pool processes'.

Pool processes write to files in ``$PROMETHEUS_MULTIPROC_DIR`` (made for the
worker when unset, and removed when it stops) and the endpoint serves their
sum, so prefork workers report every process. Setting that variable is the
one write to ``os.environ`` the library makes, before the pool forks.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from typing import Any

from amqp_events.metrics import made

logger = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class MetricsServer:
    """``/metrics`` on ``host:port`` until :meth:`stop`."""

    def __init__(self, port: int, host: str) -> None:
        self.made_dir: str | None = None
        self._use_multiprocess_dir()
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        registry: Any = None
        if MULTIPROC_ENV in os.environ:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
        served = start_http_server(port, host, **({"registry": registry} if registry else {}))
        self.server: Any = served[0] if isinstance(served, tuple) else None
        logger.info("serving metrics on http://%s:%d/metrics", host, port)

    def _use_multiprocess_dir(self) -> None:
        if MULTIPROC_ENV in os.environ:
            _clear(os.environ[MULTIPROC_ENV])  # files of a previous run would add up with this one's
        elif "prometheus_client" in sys.modules and made():
            logger.warning(
                "metrics were made before the worker started: pool children's metrics are only collected when %s "
                "is set in the worker's environment",
                MULTIPROC_ENV,
            )
        else:
            self.made_dir = os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="amqp-events-metrics-")
            if "prometheus_client" in sys.modules:  # imported early by another package (Flower's plugin of the
                # `celery` command): it chooses how a metric keeps its value as it makes one, so ours still can
                from prometheus_client import values

                values.ValueClass = values.get_value_class()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None
        if self.made_dir is not None:
            shutil.rmtree(self.made_dir, ignore_errors=True)
            self.made_dir = None


def served_here() -> bool:
    """Does something serve this process's metrics from files of every process (multiprocess mode)?"""
    return MULTIPROC_ENV in os.environ


def forget_process(pid: int) -> None:
    """A pool process ended: its in-progress gauge must not count any more."""
    if MULTIPROC_ENV in os.environ and "prometheus_client" in sys.modules:
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
