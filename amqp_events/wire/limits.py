"""What a message must be before a worker acts on it: its headers' shape, and bounds where AMQP, Celery or the
broker has a limit. Checked once, where a message enters (:mod:`amqp_events.celery.received`).

A message outside these bounds is archived with reason ``malformed_headers`` or ``too_large``, never run: Celery
would crash on a header of the wrong type (an ``id`` that is a dict, a ``task`` that is a list), py-amqp cannot
write an id over 255 bytes into a copy's ``message_id``, nor headers nested hundreds deep, and a compressed body
can inflate past anything a worker can hold or the broker can take back.

Pure: no I/O.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from amqp_events.errors import TooLarge

#: Nesting of a header value (a table in a table...): the library's own go 3 deep (``x-death``).
MAX_HEADER_DEPTH = 16
#: An AMQP short string (``message_id``, a routing key) holds at most 255 bytes.
MAX_SHORT_STRING = 255
#: A body, decompressed: RabbitMQ 4.0's default largest message (16 MiB), so that a retry or archived copy of it
#: can be published again.
MAX_BODY = 16 * 1024 * 1024
#: Enough recursion for py-amqp to read the deepest header table a 128 KiB frame can hold (5 bytes a level),
#: so that such a message reaches the checks here instead of stopping the consumer.
DECODING_RECURSION = 131_072 // 5 + 2_000


def _optional(kind: type | tuple[type, ...]) -> Callable[[Any], bool]:
    return lambda value: value is None or (isinstance(value, kind) and not isinstance(value, bool))


def _short_string(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value.encode("utf-8", "surrogatepass")) <= MAX_SHORT_STRING


def _count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def _time_limits(value: Any) -> bool:
    return value is None or (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(item is None or (isinstance(item, int | float) and not isinstance(item, bool)) for item in value)
    )


def _iso_time(value: Any) -> bool:
    if value is None:
        return True
    try:
        datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return False
    return True


def _deaths(value: Any) -> bool:
    """RabbitMQ's ``x-death``: a list of tables, each naming a queue and a reason (a forged one of another shape
    would also stop RabbitMQ's own dead-lettering of the message, stranding it)."""
    return value is None or (
        isinstance(value, list)
        and all(
            isinstance(death, dict)
            and isinstance(death.get("queue", ""), str)
            and isinstance(death.get("reason", ""), str)
            and _count(death.get("count"))
            and isinstance(death.get("routing-keys", []), list)
            for death in value
        )
    )


def _strings(value: Any) -> bool:
    return value is None or (isinstance(value, list | tuple) and all(isinstance(item, str) for item in value))


#: The headers Celery or the library reads, and what each must be when present.
EXPECTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "task": (_short_string, "an event name: a string of 1 to 255 bytes"),
    "id": (lambda v: v is None or _short_string(v), "a string of 1 to 255 bytes"),
    "ce-id": (lambda v: v is None or _short_string(v), "a string of 1 to 255 bytes"),
    "for_handler": (lambda v: v is None or _short_string(v), "a handler's task name: a string of 1 to 255 bytes"),
    "retries": (_count, "a count (an integer of 0 or more)"),
    "lost_runs": (_count, "a count (an integer of 0 or more)"),
    "root_id": (_optional(str), "a string"),
    "parent_id": (_optional(str), "a string"),
    "group": (_optional(str), "a string"),
    "origin": (_optional(str), "a string"),
    "lang": (_optional(str), "a string"),
    "shadow": (_optional(str), "a string"),
    "argsrepr": (_optional(str), "a string"),
    "kwargsrepr": (_optional(str), "a string"),
    "eta": (_iso_time, "an ISO-8601 time"),
    "expires": (_iso_time, "an ISO-8601 time"),
    # "" is a history replay's gate (amqp_events.history.gates).
    "event_key": (lambda v: v is None or v == "" or _short_string(v), "a string of up to 255 bytes"),
    "timelimit": (_time_limits, "[hard, soft] seconds"),
    "stamped_headers": (_strings, "a list of strings"),
    "stamps": (_optional(dict), "a table"),
    "ignore_result": (lambda v: v is None or isinstance(v, bool), "true or false"),
    "group_index": (_count, "a count"),
    "replaced_task_nesting": (_count, "a count"),
    "x-death": (_deaths, "RabbitMQ's dead-lettering history (a list of tables)"),
    "x-delivery-count": (_count, "a count"),
}


def depth(value: Any, limit: int = MAX_HEADER_DEPTH) -> int:
    """How deep ``value`` nests (a scalar is 0), counted up to ``limit + 1`` (deeper is not walked)."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, level = todo.pop()
        if level > limit:
            return level
        deepest = max(deepest, level)
        if isinstance(item, Mapping):
            todo.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            todo.extend((child, level + 1) for child in item)
    return deepest


def malformed(headers: Mapping[Any, Any], complete: bool = True) -> dict[str, str]:
    """The headers that are not what they must be, each with what it must be (empty: all fine); ``complete``:
    also those an event must have (a CloudEvent in structured mode, say, has them only once it is read)."""
    wrong: dict[str, str] = {}
    if complete and headers.get("id") is None and headers.get("ce-id") is None:
        wrong["id"] = "is missing: every event has an id (Celery's task id)"
    for key, value in headers.items():
        name = key if isinstance(key, str) else repr(key)
        if not isinstance(key, str):
            wrong[name] = "a header name must be a string"
        elif depth(value) > MAX_HEADER_DEPTH:
            wrong[name] = f"nested more than {MAX_HEADER_DEPTH} deep"
        elif key in EXPECTED and not EXPECTED[key][0](value):
            wrong[name] = f"must be {EXPECTED[key][1]}, not {_shown(value)}"
    return wrong


def without(headers: Mapping[Any, Any], wrong: Mapping[str, str]) -> dict[str, Any]:
    """``headers`` less the malformed ones: what an archived copy of the message can carry."""
    return {key: value for key, value in headers.items() if isinstance(key, str) and key not in wrong}


def describe(wrong: Mapping[str, str]) -> str:
    return "; ".join(f"header {name!r} {why}" for name, why in sorted(wrong.items()))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- bounded decompression -----------------------------------------------------------------------------------


def _bounded(make: Callable[[], Any], limit: int) -> Callable[[bytes], bytes]:
    """A decompressor that stops at ``limit`` bytes out instead of inflating a bomb."""

    def decompress(body: bytes) -> bytes:
        inflated = make().decompress(body, limit + 1)
        if len(inflated) > limit:
            raise TooLarge(f"the body inflates to more than {limit} bytes")
        return bytes(inflated)

    return decompress


def bounded_decoders(limit: int = MAX_BODY) -> dict[str, Callable[[bytes], bytes]]:
    """Decoders for kombu's compression types, each bounded to ``limit`` bytes of output."""
    return {
        "application/x-gzip": _bounded(lambda: zlib.decompressobj(zlib.MAX_WBITS | 32), limit),
        "application/x-bz2": _bounded(bz2.BZ2Decompressor, limit),
        "application/x-lzma": _bounded(lzma.LZMADecompressor, limit),
    }


def unsupported(content_type: str) -> Callable[[bytes], bytes]:
    def refuse(body: bytes) -> bytes:
        raise ValueError(f"compression {content_type!r} is not read (zlib, bz2 and lzma are)")

    return refuse


def json_type(content_type: str | None, content_encoding: str | None) -> tuple[str | None, str | None]:
    """``application/json; charset=utf-8`` is JSON in that charset: the content type as kombu's ``accept`` list
    names it, and the charset as the encoding (other types are left as they are)."""
    if not content_type or ";" not in content_type:
        return content_type, content_encoding
    media, _, parameters = content_type.partition(";")
    if media.strip().lower() != "application/json":
        return content_type, content_encoding
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            content_encoding = value.strip().strip('"').lower()
    return "application/json", content_encoding or "utf-8"
