"""The in-process mode against real workers: the same test, run as a pytest module in-process and on a broker."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.harness import APPS, Bench, median
from bench.scenarios import Result, Size

TESTS = 100


def a_test_module(bench: Bench, size: Size) -> Result:
    """``bench/apps/invoices_tests.py`` (100 tests: three events, retries, an archive check) under pytest, in-process;
    beside it, the same test bodies against a real broker and a real worker (fewer of them: they wait real delays)."""
    in_process = median([_pytest_module() for _ in range(size.repeats)])
    per_test_on_a_broker, measured = _on_a_broker(bench, size)
    on_a_broker = per_test_on_a_broker * TESTS
    return Result(
        f"a test module of {TESTS} tests (3 events each, retries and an archive check), in-process",
        f"{in_process:.2f} s for the module under pytest (startup included)",
        f"the same tests on a real broker with a real worker: {per_test_on_a_broker:.2f} s a test "
        f"({measured} measured), {on_a_broker:.0f} s for {TESTS}",
        in_process / on_a_broker,  # the module's time as a share of the broker equivalent's
        "< 2 s for the module",
        in_process < 2.0,
        {"in-process module": in_process, f"{TESTS} tests on a broker": on_a_broker},
    )


def _pytest_module() -> float:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "invoices_tests.py"],
        cwd=APPS,
        env={**os.environ, "PYTHONPATH": str(APPS)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    seconds = time.monotonic() - started
    if done.returncode != 0 or f"{TESTS} passed" not in done.stdout:
        raise RuntimeError(f"the in-process test module failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return seconds


def _on_a_broker(bench: Bench, size: Size) -> tuple[float, int]:
    """Seconds per test of the same test bodies on a broker (one worker for all, as a module fixture would)."""
    tests = max(2, size.repeats * 2)
    with bench.run("in-process-equivalent") as run, run.worker("invoices", service="shipping"):
        os.environ["BROKER_URL"] = run.url
        sys.modules.pop("invoices", None)
        import invoices

        archive = invoices.billing.archive("shipping")
        started = time.monotonic()
        for n in range(tests):
            for invoice_id in range(3 * n, 3 * n + 3):
                invoices.invoice_paid(invoice_id, "10.00")
            handled = {3 * n + 1, 3 * n + 2}
            run.wait_marks(lambda marks, handled=handled: handled <= {mark["n"] for mark in marks}, timeout=60)
            deadline = time.monotonic() + 60
            while len(archived := archive.list()) < n + 1:
                if time.monotonic() > deadline:
                    raise TimeoutError("the archived invoice never arrived")
                time.sleep(0.05)
            assert (archived[-1].reason, archived[-1].attempts) == ("max_retries", 3)
        seconds = (time.monotonic() - started) / tests
        invoices.billing.close()
        invoices.shipping.close()
        sys.modules.pop("invoices", None)
    return seconds, tests
