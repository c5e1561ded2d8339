"""Does a handler take what a producer fires? JSON Schemas of payloads, compared from the consumer's side.

The schemas are those of the services' AsyncAPI documents (:mod:`amqp_events.asyncapi.schemas`): an object of
the event's keyword arguments, each described by its annotation. A consumer *accepts* a producer's schema when
every payload the producer may send is one the handler runs with: each argument the handler requires is always
sent, each value is of a type the handler takes, and nothing is sent that a handler without ``**kwargs`` would
refuse. Pure: no broker, no app.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Schema = Mapping[str, Any]
#: Looks a ``$ref`` up in the document that holds it.
Resolve = Callable[[str], Schema]
#: Why a handler without ``**kwargs`` refuses an argument it has no parameter for.
SENT_NOT_TAKEN = ": sent, and not taken"
#: A JSON value of type ``integer`` is a ``number`` too.
_WIDER = {"integer": {"number"}}


def accepts(consumer: Schema, producer: Schema, resolve: Resolve, mine: Resolve | None = None) -> list[str]:
    """Why ``consumer`` refuses payloads ``producer`` allows (empty: it takes them all); ``resolve`` looks up
    the producer's references, ``mine`` the consumer's (the same document when omitted)."""
    return _accepts(consumer, producer, resolve, mine or resolve, "", set())


def _accepts(consumer: Schema, producer: Schema, theirs: Resolve, mine: Resolve, at: str, seen: set[str]) -> list[str]:
    if "$ref" in consumer:
        if consumer["$ref"] in seen:  # a recursive model: judged once
            return []
        return _accepts(mine(consumer["$ref"]), producer, theirs, mine, at, {*seen, consumer["$ref"]})
    if "$ref" in producer:
        return _accepts(consumer, theirs(producer["$ref"]), theirs, mine, at, seen)
    if "anyOf" in producer:  # every branch must be taken
        return [why for branch in producer["anyOf"] for why in _accepts(consumer, branch, theirs, mine, at, seen)]
    if "anyOf" in consumer:  # some branch takes it
        found = [_accepts(branch, producer, theirs, mine, at, seen) for branch in consumer["anyOf"]]
        if any(not why for why in found):
            return []
        return [f"{at or 'the payload'}: {describe(producer)} is none of {describe(consumer)}"]
    if "enum" in consumer:
        allowed = producer.get("enum")
        if allowed is None or not set(map(repr, allowed)) <= set(map(repr, consumer["enum"])):
            return [f"{at}: {describe(producer)} may be outside {describe(consumer)}"]
        return []
    wanted, given = _types(consumer), _types(producer)
    if wanted and (not given or not all(kind in wanted or _WIDER.get(kind, set()) & wanted for kind in given)):
        return [f"{at or 'the payload'}: {describe(producer)} where {describe(consumer)} is taken"]
    if "object" in wanted:
        return _object(consumer, producer, theirs, mine, at, seen)
    if "array" in wanted and "items" in consumer and "items" in producer:
        return _accepts(consumer["items"], producer["items"], theirs, mine, f"{at}[]", seen)
    return []


def _object(consumer: Schema, producer: Schema, theirs: Resolve, mine: Resolve, at: str, seen: set[str]) -> list[str]:
    taken, sent = consumer.get("properties", {}), producer.get("properties", {})
    always = set(producer.get("required", ()))
    found = []
    for name in consumer.get("required", ()):
        if name not in sent:
            found.append(f"{_in(at, name)}: required, and not sent")
        elif name not in always:
            found.append(f"{_in(at, name)}: required, and sent only sometimes")
    for name, schema in taken.items():
        if name in sent:
            found.extend(_accepts(schema, sent[name], theirs, mine, _in(at, name), seen))
    if consumer.get("additionalProperties") is False:
        found.extend(f"{_in(at, name)}{SENT_NOT_TAKEN}" for name in sent if name not in taken)
    return found


def _types(schema: Schema) -> set[str]:
    kind = schema.get("type")
    if kind is None:
        return set()
    return {kind} if isinstance(kind, str) else set(kind)


def _in(at: str, name: str) -> str:
    return f"{at}.{name}" if at else name


def describe(schema: Schema) -> str:
    """A schema in a few words: ``integer``, ``string (date-time)``, ``one of 'a', 'b'``, ``Address``."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(describe(branch) for branch in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(repr(value) for value in schema["enum"])
    kinds = sorted(_types(schema))
    if not kinds:
        return "anything"
    text = " or ".join(kinds)
    return f"{text} ({schema['format']})" if "format" in schema else text
