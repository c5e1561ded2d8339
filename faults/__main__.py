"""``python -m faults [--events N] [--cluster 3 [--partition]]``: one fault-injection run, its audit in Markdown."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from faults.scenario import run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=10_000, help="events to fire (default 10,000)")
    parser.add_argument("--duration", type=float, help="seconds to fire them over (default: events / 60)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--outbox", action="store_true", help="fire through the transactional outbox (PostgreSQL)")
    parser.add_argument("--inbox", action="store_true", help="handlers write their effects through the inbox")
    parser.add_argument("--cluster", type=int, default=0, metavar="N", help="a cluster of N nodes, killed in rotation")
    parser.add_argument(
        "--partition", action="store_true", help="with --cluster: nodes cut off in rotation, not killed"
    )
    options = parser.parse_args()
    if options.partition and options.cluster < 3:
        parser.error("--partition needs --cluster 3 (or more): a majority must go on")
    duration = options.duration or options.events / 60
    with tempfile.TemporaryDirectory(prefix="amqp-events-faults-") as workdir:
        report = run(
            options.events, Path(workdir), duration, options.seed,
            outbox=options.outbox, inbox=options.inbox, cluster=options.cluster, partition=options.partition,
        )  # fmt: skip
    print("| | |\n|---|---|")
    print(report.table())
    if report.lost:
        print(f"\nlost: {report.lost[:20]}")
    if report.archive_missing or report.archive_unexpected:
        print(f"\nmissing from the archive: {report.archive_missing[:20]}")
        print(f"archived unexpectedly: {report.archive_unexpected[:20]}")
    print("\nPASS" if report.ok else "\nFAIL")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
