"""A worker's health probes over HTTP (``amqp_events_health_port``), for a deployment's liveness and readiness
checks (Kubernetes' ``httpGet`` probes, a compose file's ``healthcheck``).

* ``/livez``: 200 while the worker's event loop turns (it ticks every second) or its consumer reconnects (a
  restart would not bring the broker back); 503 once the loop has not turned for ``amqp_events_health_stall``
  seconds: a stuck process to restart. A solo worker's loop runs its handlers: the stall allows the longest one.
* ``/readyz``: 200 while the worker is connected and consumes every queue it was given (but those a breaker
  paused); 503 otherwise (the broker is away, the worker is starting or stopping), with the reason.

Each answers a small JSON object. The server runs in a thread of the worker's main process from the moment the
consumer step is made until the worker stops.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from celery import bootsteps

from amqp_events.celery.steps import breakers_of

logger = logging.getLogger(__name__)

#: Seconds between two turns the loop marks.
TICK = 1.0
#: Connections answered at once (one thread each; more are closed at once), and seconds one may stay idle.
MAX_CONNECTIONS, IDLE_TIMEOUT = 16, 5.0


class BoundedServer(ThreadingHTTPServer):
    """A threading HTTP server with at most :data:`MAX_CONNECTIONS` connections (so threads) at once: probes come
    every few seconds, and idle connections without bound would each hold a thread."""

    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # closed at once: the probes' own connections get a slot soon
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class Probes:
    """What the probes answer: when the loop last turned, and whether the consumer is ready (and why not)."""

    def __init__(self, stall: float) -> None:
        self.stall = stall
        self.turned = time.monotonic()
        self.ready, self.why = False, "starting"
        #: The consumer stopped and starts again (the broker went away): its loop does not turn meanwhile.
        self.reconnecting = True

    def live(self) -> tuple[bool, dict[str, Any]]:
        since = round(time.monotonic() - self.turned, 3)  # judged as said: a stall says more than its limit
        body = {"loop_turned_seconds_ago": since, "stall": self.stall, "reconnecting": self.reconnecting}
        return self.reconnecting or since <= self.stall, body

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return self.ready, {"ready": self.ready, "why": self.why}


def serve(probes: Probes, host: str, port: int) -> ThreadingHTTPServer:
    """``/livez`` and ``/readyz`` of ``probes`` on ``host:port``, in a daemon thread."""

    class Answer(BaseHTTPRequestHandler):
        timeout = IDLE_TIMEOUT  # a connection that sends nothing is closed

        def do_GET(self) -> None:  # http.server's name
            paths = {"/livez": probes.live, "/readyz": probes.readiness}
            probe = paths.get(self.path.split("?")[0])
            ok, body = probe() if probe is not None else (False, {"error": "not found: /livez or /readyz"})
            text = json.dumps(body).encode()
            self.send_response(404 if probe is None else 200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: quiet
            pass

    server = BoundedServer((host, port), Answer)
    threading.Thread(target=server.serve_forever, daemon=True, name="amqp-events-health").start()
    logger.info("serving health probes on http://%s:%d/livez and /readyz", host, server.server_address[1])
    return server


class HealthProbes(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer step: the health probes' server, and the ticks that feed it."""

    label = "amqp-events health probes"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        settings = parent.app.events_settings
        self.probes = Probes(settings.health_stall)
        self.server = serve(self.probes, settings.health_host, settings.health_port) if settings.health_port else None
        self.timer_entry: Any = None

    def start(self, c: Any) -> None:
        if self.server is not None and self.timer_entry is None:
            self.tick(c)
            self.timer_entry = c.timer.call_repeatedly(TICK, self.tick, (c,))

    def stop(self, c: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None
        self.probes.ready, self.probes.why = False, "the consumer stopped (reconnecting, or the worker stops)"
        self.probes.reconnecting = True

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        if self.server is not None:
            self.server.shutdown()
            self.server = None

    def tick(self, c: Any) -> None:
        """The loop turned: say so, and look whether the consumer is ready."""
        self.probes.turned, self.probes.reconnecting = time.monotonic(), False
        self.probes.ready, self.probes.why = readiness(c)


def readiness(c: Any) -> tuple[bool, str]:
    """Is the consumer ``c`` connected and consuming every queue it was given but those a breaker paused?"""
    connection = c.connection
    if connection is None or not connection.connected:
        return False, "not connected to the broker"
    if c.host.consumes_in_processes:  # the main process consumes nothing: its processes do
        consuming, processes = sum(c.pool.shared.consuming), c.pool.limit
        if consuming < processes:
            why = "others starting, replaced or reconnecting"
            return False, f"{consuming} of its {processes} processes consuming ({why})"
        return True, f"connected; its {processes} processes consuming"
    task_consumer = c.task_consumer
    if task_consumer is None:
        return False, "not consuming yet"
    breakers = breakers_of(c.app)
    paused = breakers.paused_queues() if breakers is not None else set()
    missing = sorted(
        name for name in c.app.amqp.queues.consume_from if name not in paused and not task_consumer.consuming_from(name)
    )
    if missing:
        return False, f"not consuming {', '.join(missing)}"
    return True, "connected and consuming"
