"""The audit of one fault-injection run, as figures and a Markdown table (RELIABILITY.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Report:
    events: int
    outbox: bool = False
    inbox: bool = False
    cluster: int = 0
    partition: bool = False
    #: Nodes SIGKILLed (or, in partition mode, cut off) in rotation.
    node_faults: int = 0
    rabbitmq: str = ""
    duplicate_effects: int = 0
    skipped_duplicates: int = 0
    confirmed: int = 0
    rolled_back: int = 0
    phantoms: list[int] = field(default_factory=list)
    fire_errors: int = 0
    expected_pairs: int = 0
    handled_pairs: int = 0
    handler_runs: int = 0
    duplicate_handled: int = 0
    lost: list[tuple[int, str]] = field(default_factory=list)
    archived: Counter[str] = field(default_factory=Counter)
    archive_duplicates: int = 0
    archive_missing: list[str] = field(default_factory=list)
    archive_unexpected: list[str] = field(default_factory=list)
    leftover: dict[str, int] = field(default_factory=dict)
    worker_kills: int = 0
    relay_kills: int = 0
    outbox_left: int = 0
    broker_restarts: int = 0
    #: Leaders restarted to send on dead letters a node loss stranded (RabbitMQ 3.10; RELIABILITY.md).
    stranded_restarts: list[str] = field(default_factory=list)
    bad_inputs: int = 0
    refused_bad_inputs: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.archive_missing or self.archive_unexpected or self.leftover or self.phantoms
        ) and not (self.outbox_left or self.duplicate_effects)

    @property
    def node_fault_label(self) -> str:
        if self.partition:
            return "network partitions: one node cut off from the others in rotation (25 s each), then healed"
        return "cluster nodes SIGKILLed in rotation, then restarted"

    def table(self) -> str:
        fired = [("events fired (confirmed by the broker)", self.confirmed)]
        if self.outbox:
            fired = [
                ("events committed through the outbox (one transaction each)", self.confirmed),
                ("transactions rolled back after firing", self.rolled_back),
                ("events of rolled-back transactions handled (must be 0)", len(self.phantoms)),
                ("rows left in the outbox (must be 0)", self.outbox_left),
                ("relay processes SIGKILLed and restarted", self.relay_kills),
            ]
        effects = [
            ("duplicate deliveries the inbox skipped", self.skipped_duplicates),
            ("duplicate effects: pairs with more than one committed effect (must be 0)", self.duplicate_effects),
        ]
        rows = [
            *fired,
            *(effects if self.inbox else []),
            ("firing attempts that raised (broker down), then retried", self.fire_errors),
            ("(event, service) pairs to handle (poison excluded)", self.expected_pairs),
            ("pairs handled", self.handled_pairs),
            ("handler runs, failures and retries included", self.handler_runs),
            ("duplicate successful runs (at-least-once)", self.duplicate_handled),
            ("archived, by reason", dict(sorted(self.archived.items()))),
            ("duplicate archive entries", self.archive_duplicates),
            ("lost (must be 0)", len(self.lost)),
            ("missing from the archive (must be 0)", len(self.archive_missing)),
            ("archived unexpectedly (must be 0)", len(self.archive_unexpected)),
            ("messages left in main or delay queues (must be none)", self.leftover or "none"),
            ("worker processes SIGKILLed and restarted", self.worker_kills),
            ("broker crashes (SIGKILL) and restarts", self.broker_restarts),
            *([(self.node_fault_label, self.node_faults)] if self.cluster else []),
            *(
                [("leaders restarted to free stranded dead letters (RELIABILITY.md)", self.stranded_restarts or "none")]
                if self.cluster
                else []
            ),
            ("bad inputs published", self.bad_inputs),
            ("bad inputs the broker refused at publish time", self.refused_bad_inputs),
            ("RabbitMQ", self.rabbitmq),
            ("duration (s)", round(self.seconds)),
        ]
        return "\n".join(f"| {label} | {value} |" for label, value in rows)
