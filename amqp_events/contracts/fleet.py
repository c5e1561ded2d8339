"""The fleet's event contracts: what each service fires and handles, read from its AsyncAPI document, and what
changed between a baseline and now, judged from the consumers' side.

A change breaks a consumer when, after it, a handler would refuse an event: one fired now (a producer's
arguments against a handler's signature), or one fired before the change and still at rest in a queue, an
archive or the history (the baseline's arguments against today's handler), or when an event that services
handle is fired by nobody any more. Every other change is reported too, as breaking nobody. Pure: the
documents in, findings out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from amqp_events.contracts.schemas import SENT_NOT_TAKEN, Schema, accepts, describe
from amqp_events.contracts.tables import markdown_table


@dataclass(frozen=True)
class Contract:
    """One service's side of its events: the payload schema of each event it fires, and of each handler."""

    service: str
    #: Event name -> the payload it fires.
    fires: Mapping[str, Schema]
    #: Handler (its task name: the event, or ``<event>:<name>``) -> the payload it takes.
    handles: Mapping[str, Schema]
    #: The document's ``components.schemas``, for references.
    definitions: Mapping[str, Schema] = field(default_factory=dict)
    #: Event name -> the version of the arguments it fires (1 when the document says none).
    versions: Mapping[str, int] = field(default_factory=dict)
    #: Handler -> the versions its upcasters take (an event fired at one of them is upcast before it runs).
    upcasts: Mapping[str, frozenset[int]] = field(default_factory=dict)
    #: Handler -> the version of the arguments it takes.
    takes: Mapping[str, int] = field(default_factory=dict)

    def resolve(self, reference: str) -> Schema:
        return self.definitions.get(reference.rsplit("/", 1)[-1], {})

    def handlers_of(self, event: str) -> dict[str, Schema]:
        return {task: schema for task, schema in self.handles.items() if task.split(":", 1)[0] == event}


def read(document: Mapping[str, Any]) -> Contract:
    """The contract in a service's AsyncAPI document (``amqp-events -A APP asyncapi``)."""
    schemas = document.get("components", {}).get("schemas", {})
    fires, handles, versions, upcasts, takes = {}, {}, {}, {}, {}
    for key, operation in document.get("operations", {}).items():
        kind, _, name = key.partition(".")
        if kind == "fire" and operation.get("action") == "send":
            fires[name] = schemas.get(name, {})
            versions[name] = int(operation.get("x-event-version", 1))
        elif kind == "handle" and operation.get("action") == "receive":
            handles[name] = schemas.get(name, {})
            upcasts[name] = frozenset(int(version) for version in operation.get("x-upcasts-from", ()))
            # A document written before versions said none: the version after its upcasters' (as the worker's).
            takes[name] = int(operation.get("x-event-version", max(upcasts[name], default=0) + 1))
    return Contract(document["info"]["title"], fires, handles, schemas, versions, upcasts, takes)


@dataclass(frozen=True)
class Finding:
    """One change of the fleet's contracts, and whether it breaks a consumer."""

    breaking: bool
    event: str
    #: The service whose arguments changed, or that fires the event (``""``: none).
    producer: str
    #: The handler concerned, ``service/handler`` (``""``: none).
    consumer: str
    change: str
    why: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "why": list(self.why)}


def check(baseline: Iterable[Contract], current: Iterable[Contract]) -> list[Finding]:
    """Every change from ``baseline`` to ``current`` (both: one contract per service), breaking ones first."""
    before, now = {c.service: c for c in baseline}, {c.service: c for c in current}
    names = {name for fleet in (before, now) for c in fleet.values() for name in (*c.fires, *c.handles)}
    found: list[Finding] = []
    for event in sorted({name.split(":", 1)[0] for name in names}):
        found.extend(EventChange(event, before, now).findings())
    return sorted(found, key=lambda finding: not finding.breaking)


class EventChange:
    """One event's producers and handlers, in the baseline and now."""

    def __init__(self, event: str, before: Mapping[str, Contract], now: Mapping[str, Contract]) -> None:
        self.event, self.before, self.now = event, before, now
        self.fired_then = {s: c for s, c in before.items() if event in c.fires}
        self.fired_now = {s: c for s, c in now.items() if event in c.fires}
        self.handlers = [(c, task, schema) for c in now.values() for task, schema in c.handlers_of(event).items()]
        #: The services that fire it with other arguments than before, or newly.
        self.changed = {s for s, c in self.fired_now.items() if _changed(c, before.get(s), "fires", event)}
        #: The producers and handlers some breaking finding names.
        self.involved: set[str] = set()

    def findings(self) -> list[Finding]:
        found = self._unfired()
        for consumer, task, schema in self.handlers:
            found += self._handler(consumer, task, schema)
        return found + self._producers() + self._removed()

    def _unfired(self) -> list[Finding]:
        """Each handler of an event that was fired and is fired by nobody now."""
        if not self.fired_then or self.fired_now:
            return []
        why = (f"fired before by {', '.join(sorted(self.fired_then))}",)
        return [Finding(True, self.event, "", f"{c.service}/{task}", "no longer fired by any service", why)
                for c, task, _ in self.handlers]  # fmt: skip

    def _handler(self, consumer: Contract, task: str, schema: Schema) -> list[Finding]:
        """A handler of today against what is fired now, and (if it changed) what was fired before."""
        name, event = f"{consumer.service}/{task}", self.event
        changed = _changed(consumer, self.before.get(consumer.service), "handles", task)
        found = []
        for service, producer in sorted(self.fired_now.items()):
            why = self._refused(consumer, task, schema, producer)
            if why:
                change = _what_changed(service in self.changed, changed, service in self.fired_then)
                found.append(Finding(True, event, service, name, change, tuple(why)))
                self.involved |= {service, name}
        if not changed:
            return found
        for service, producer in sorted(self.fired_then.items()):  # what it fired waits in queues and archives
            if service in self.fired_now and service not in self.changed:
                continue  # the same arguments, judged above
            why = self._refused(consumer, task, schema, producer)
            if why:
                found.append(Finding(True, event, service, name, "events fired before, at rest, would be refused",
                                     tuple(why)))  # fmt: skip
                self.involved.add(name)
        if name not in self.involved:
            then = self.before.get(consumer.service)
            old = then.handles.get(task) if then is not None else None
            change = "new handler" if old is None else "its handler takes other arguments"
            found.append(Finding(False, event, "", name, change, tuple(differences(old, schema)) if old else ()))
        return found

    def _refused(self, consumer: Contract, task: str, schema: Schema, producer: Contract) -> list[str]:
        """Why the handler refuses what ``producer`` fires (nothing, when one of its upcasters takes that version:
        what it makes of it is the upcaster's to say; of a later version, the arguments it does not take are left
        out, not refused)."""
        fired, upcasts = producer.versions.get(self.event, 1), consumer.upcasts.get(task, frozenset())
        if fired in upcasts:
            return []
        why = accepts(schema, producer.fires[self.event], producer.resolve, consumer.resolve)
        if fired > consumer.takes.get(task, 1):  # later than it takes: what it has no parameter for is left out
            why = [reason for reason in why if not reason.endswith(SENT_NOT_TAKEN)]
        return why

    def _producers(self) -> list[Finding]:
        """The producers whose change breaks nobody, and those that stopped firing it."""
        found = []
        for service in sorted(self.changed - self.involved):
            old = self.fired_then.get(service)
            new = self.fired_now[service].fires[self.event]
            why = tuple(differences(old.fires[self.event], new)) if old is not None else ()
            found.append(
                Finding(False, self.event, service, "", "fired with other arguments" if old else "newly fired", why)
            )
        for service in sorted(set(self.fired_then) - set(self.fired_now)):
            found.append(Finding(False, self.event, service, "", "no longer fired by this service"))
        return found

    def _removed(self) -> list[Finding]:
        found = []
        for service, contract in self.before.items():
            kept = self.now[service].handles if service in self.now else {}
            for task in sorted(set(contract.handlers_of(self.event)) - set(kept)):
                found.append(Finding(False, self.event, "", f"{service}/{task}", "handler removed"))
        return found


def _changed(contract: Contract, then: Contract | None, side: str, name: str) -> bool:
    """Is ``name`` (an event fired, or a handler) new in ``contract``, or described otherwise than ``then``?"""
    old = getattr(then, side).get(name) if then is not None else None
    return old is None or _plain(old, then) != _plain(getattr(contract, side)[name], contract)


def _what_changed(producer: bool, handler: bool, fired_before: bool) -> str:
    if producer and handler:
        return "both the arguments fired and the handler changed"
    if producer:
        return "fired with other arguments" if fired_before else "fired by a new producer"
    if handler:
        return "its handler takes other arguments"
    return "as in the baseline"


def _plain(schema: Schema, contract: Contract | None) -> Any:
    """``schema`` with its references written out, to compare two documents' schemas by what they say."""

    def inline(value: Any, seen: frozenset[str]) -> Any:
        if isinstance(value, Mapping):
            reference = value.get("$ref")
            if isinstance(reference, str) and contract is not None and reference not in seen:
                return inline(contract.resolve(reference), seen | {reference})
            return {key: inline(item, seen) for key, item in value.items() if key not in ("description", "title")}
        if isinstance(value, list):
            return [inline(item, seen) for item in value]
        return value

    return inline(schema, frozenset())


def differences(before: Schema, after: Schema) -> list[str]:
    """The arguments added, removed, made required or optional, or of another type, in a few words each."""
    old, new = before.get("properties", {}), after.get("properties", {})
    required_old, required_new = set(before.get("required", ())), set(after.get("required", ()))
    found = [f"{name} added ({describe(new[name])}, {'required' if name in required_new else 'optional'})"
             for name in new if name not in old]  # fmt: skip
    found += [f"{name} removed" for name in old if name not in new]
    for name in (name for name in new if name in old):
        if describe(old[name]) != describe(new[name]):
            found.append(f"{name}: {describe(old[name])} -> {describe(new[name])}")
        if (name in required_old) != (name in required_new):
            found.append(f"{name} now {'required' if name in required_new else 'optional'}")
    return found


def markdown(findings: list[Finding]) -> str:
    """The findings as a Markdown table, breaking ones first."""
    if not findings:
        return "No change to any event's contract.\n"
    rows = (
        ["breaking" if f.breaking else "ok", f.event, f.producer, f.consumer, f.change, "; ".join(f.why)]
        for f in findings
    )
    return markdown_table(["verdict", "event", "producer", "consumer", "change", "why"], rows)
