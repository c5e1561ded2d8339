"""The package's shape, kept by tools: layers without cycles (import-linter's contracts in pyproject.toml),
small modules, every public exception in one place, and nothing done at import time."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import amqp_events
from amqp_events import errors

PACKAGE = Path(amqp_events.__file__).parent
ROOT = PACKAGE.parent


def test_the_import_contracts_hold():
    """Layers from the CLI down to the pure parts, Celery in the adapter only, no cycle at any depth."""
    done = subprocess.run(
        [Path(sys.executable).parent / "lint-imports", "--no-cache", "--no-logo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_no_module_is_longer_than_400_lines():
    long = {
        str(path.relative_to(ROOT)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > 400
    }
    assert long == {}


def test_every_exception_is_defined_in_errors_and_each_a_caller_sees_has_one_base():
    defined = {
        value
        for value in vars(errors).values()
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == errors.__name__
    }
    # Raised to a caller (and exported by the package where a user's code meets it), or only a reason written
    # into the archive (an outcome's exception type).
    raised = {kind for kind in defined if issubclass(kind, errors.AmqpEventsError)}
    reasons = {errors.WorkerLost, errors.Rejected, errors.RetryRequested, errors.BreakerOpen, errors.Expired,
               errors.Postponed, errors.ProcessStopping, errors.OverLimit, errors.Revoked, errors.Archived}  # fmt: skip
    assert defined == raised | reasons and not raised & reasons
    exported = {getattr(amqp_events, name) for name in amqp_events.__all__}
    assert not reasons & exported and errors.AmqpEventsError in exported
    elsewhere = set()
    for path in PACKAGE.rglob("*.py"):
        if path.name == "errors.py":
            continue
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith("class ") and stripped.endswith(("Error):", "Exception):")):
                elsewhere.add(stripped)
    # A click error of the command line (printed, never raised to a user's code), and one module's own
    # signal between two of its functions:
    assert elsewhere == {
        "class AppNotFound(click.ClickException):",
        "class QueueFull(Exception):",
        "class BrokerUnavailable(Exception):",
    }


def test_importing_the_package_connects_nothing_to_celery():
    """No signal receivers or control commands until an app is made (``events_app``)."""
    script = (
        "from celery import signals\n"
        "from celery.worker.control import Panel\n"
        "import amqp_events, amqp_events.cli, amqp_events.testing\n"
        "connected = [s for s in (signals.after_setup_logger, signals.after_setup_task_logger) if s.receivers]\n"
        "assert not connected, connected\n"
        "assert 'amqp_events_breaker' not in Panel.data\n"
        "amqp_events.events_app('orders')\n"
        "assert 'amqp_events_breaker' in Panel.data\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
