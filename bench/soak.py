"""The soak: ``python -m bench.soak [EVENTS]`` (1,000,000 by default), a run of its own, not CI.

Three services each subscribe ``soak.tick`` and run ``celery -A soak worker -c 2`` as typed (the consuming pool).
The benchmark fires ``EVENTS`` events in batches while they handle them, holding each queue under
``MAX_DEPTH`` waiting; one event in a hundred fails its first attempt and is retried through the delay ladder.
Every process's resident memory is sampled every ``SAMPLE_EVERY`` seconds. At the end each service must have
handled every event exactly once, with nothing archived and nothing left waiting; the memory of every process
after warm-up (the first tenth of the events) must stay within 10% (``bench/apps/soak.py`` records the runs).
"""

from __future__ import annotations

import contextlib
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from amqp_events.celery import events_app
from bench.harness import Bench, Run

SERVICES = ("soak-a", "soak-b", "soak-c")
EVENT = "soak.tick"
BATCH = 1000
MAX_DEPTH = 50_000
SAMPLE_EVERY = 10.0


def main(events: int) -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="amqp-events-soak-") as workdir, Bench(Path(workdir)) as bench:
        with bench.run("soak") as run:
            handled = Path(workdir) / "handled"
            handled.mkdir()
            run.extra_env = {"SOAK_DIR": str(handled)}
            with contextlib.ExitStack() as workers:
                pids = {}
                for service in SERVICES:
                    worker = workers.enter_context(run.worker("soak", pool=None, concurrency=2, service=service))
                    pids[service] = worker.pid
                memory = Memory(pids)
                fire(run, events, memory)
                wait_handled(handled, events, memory)
                memory.sample(events)
            waiting = {queue: run.queue_depth(queue) for queue in queues()}
            archived = {service: run.queue_depth(f"{service}.archive") for service in SERVICES}
        counts = {service: handled_counts(handled, service) for service in SERVICES}
    print(report(events, counts, memory, waiting, archived, time.monotonic() - started))
    ok = all(_exactly_once(counts[service], events) for service in SERVICES)
    return 0 if ok and not any(waiting.values()) and not any(archived.values()) and memory.flat() else 1


def fire(run: Run, events: int, memory: Memory) -> None:
    """``events`` events in batches, holding every service's queue under ``MAX_DEPTH`` waiting."""
    app = events_app("soak-producer", broker_url=run.url)
    for start in range(0, events, BATCH):
        while max(run.queue_depth(queue) for queue in queues()) > MAX_DEPTH:
            time.sleep(0.2)
            memory.maybe_sample(start)
        with app.batch():
            for n in range(start, min(events, start + BATCH)):
                app.fire(EVENT, kwargs={"n": n})
        memory.maybe_sample(start)
    app.close()


def wait_handled(handled: Path, events: int, memory: Memory, timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    while any(recorded(handled, service) < events for service in SERVICES):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every event handled: {[recorded(handled, s) for s in SERVICES]}")
        memory.maybe_sample(events)
        time.sleep(1)


def recorded(handled: Path, service: str) -> int:
    return sum(path.stat().st_size for path in handled.glob(f"{service}-*.bin")) // 4


def handled_counts(handled: Path, service: str) -> Counter[int]:
    counts: Counter[int] = Counter()
    for path in handled.glob(f"{service}-*.bin"):
        data = path.read_bytes()
        counts.update(n for (n,) in struct.iter_unpack("<I", data[: len(data) // 4 * 4]))
    return counts


def queues() -> list[str]:
    return [f"{service}:{EVENT}" for service in SERVICES]


def _exactly_once(counts: Counter[int], events: int) -> bool:
    return len(counts) == events and max(counts.values()) == 1 and min(counts) == 0 and max(counts) == events - 1


class Memory:
    """Resident memory of every process of the workers (the main processes and their pool's), sampled over time."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.samples: list[tuple[int, dict[str, int]]] = []  # (events fired, {process: KB})
        self.next = 0.0

    def maybe_sample(self, fired: int) -> None:
        if time.monotonic() >= self.next:
            self.sample(fired)

    def sample(self, fired: int) -> None:
        self.next = time.monotonic() + SAMPLE_EVERY
        found: dict[str, int] = {}
        for service, pid in self.pids.items():
            for member in [pid, *_children(pid)]:
                kb = _rss_kb(member)
                if kb is not None:
                    found[f"{service} {'main' if member == pid else member}"] = kb
        self.samples.append((fired, found))

    def after_warm_up(self) -> list[tuple[int, dict[str, int]]]:
        last = self.samples[-1][0] if self.samples else 0
        return [sample for sample in self.samples if sample[0] >= last // 10]

    def growth(self) -> dict[str, float]:
        """Each process's largest resident memory after warm-up over its first sample after it (kept processes)."""
        first: dict[str, int] = {}
        largest: dict[str, int] = {}
        for _, found in self.after_warm_up():
            for process, kb in found.items():
                first.setdefault(process, kb)
                largest[process] = max(largest.get(process, 0), kb)
        return {process: largest[process] / first[process] for process in first}

    def flat(self) -> bool:
        return all(ratio <= 1.10 for ratio in self.growth().values())


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _rss_kb(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0])
    except (OSError, IndexError):
        return None


def report(
    events: int,
    counts: dict[str, Counter[int]],
    memory: Memory,
    waiting: dict[str, int],
    archived: dict[str, int],
    seconds: float,
) -> str:
    lines = [f"soak: {events:,} events to {len(SERVICES)} services in {seconds / 60:.1f} minutes"]
    for service, handled in counts.items():
        duplicates = sum(count - 1 for count in handled.values() if count > 1)
        lost = events - len(handled)
        lines.append(f"* {service}: {len(handled):,} handled once each, {lost} lost, {duplicates} duplicates")
    lines.append(f"* waiting at the end: {waiting}; archived: {archived}")
    growth = memory.growth()
    lines.append(f"* resident memory after warm-up, largest over first: max {max(growth.values()):.3f}x")
    for process, ratio in sorted(growth.items()):
        first = next(found[process] for _, found in memory.after_warm_up() if process in found)
        lines.append(f"    {process}: {first / 1024:.1f} MB, then at most {ratio:.3f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000))
