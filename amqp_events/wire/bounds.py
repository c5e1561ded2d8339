"""What a message must be before a worker acts on it: its headers' shape, and bounds where AMQP, Celery or the
broker has a limit. Checked once, where a message enters (:func:`amqp_events.core.router.route`).

A message outside these bounds is archived with reason ``malformed_headers`` or ``too_large``, never run: Celery
would crash on a header of the wrong type (an ``id`` that is a dict, a ``task`` that is a list), py-amqp cannot
write an id over 255 bytes into a copy's ``message_id``, nor headers nested hundreds deep, and a compressed body
can inflate past anything a worker can hold or the broker can take back.

Pure: no I/O.
"""

from __future__ import annotations

import bz2
import hashlib
import lzma
import zlib
from collections.abc import Callable, Mapping
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from kombu.exceptions import ContentDisallowed

from amqp_events.errors import Refused, TooLarge
from amqp_events.wire.message import Reason

#: Nesting of a header value (a table in a table...): the library's own go 3 deep (``x-death``).
MAX_HEADER_DEPTH = 16
#: An AMQP short string (``message_id``, a routing key) holds at most 255 bytes.
MAX_SHORT_STRING = 255
#: A body, decompressed: RabbitMQ 4.0's default largest message (16 MiB), so that a retry or archived copy of it
#: can be published again (``amqp_events_max_body_bytes``).
MAX_BODY = 16 * 1024 * 1024
#: A count (retries, deliveries): anything larger is nonsense, and a copy must still count one more in an AMQP
#: signed 32-bit integer.
MAX_COUNT = 2**31 - 2
#: Bytes a message's headers may take, encoded: a copy adds its own (an archived one about 6 KiB) and must still
#: fit the one frame AMQP gives a message's properties (RabbitMQ's ``frame_max``, 128 KiB by default).
MAX_HEADERS_BYTES = 64 * 1024
#: Bytes of a body over the bound that an archived copy keeps, for an operator to see what it was.
KEPT_BODY_BYTES = 4096
#: Enough recursion for py-amqp to read the deepest header table a 128 KiB frame can hold (5 bytes a level),
#: so that such a message reaches the checks here instead of stopping the consumer.
DECODING_RECURSION = 131_072 // 5 + 2_000


def _optional(kind: type | tuple[type, ...]) -> Callable[[Any], bool]:
    return lambda value: value is None or (isinstance(value, kind) and not isinstance(value, bool))


def _short_string(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value.encode("utf-8", "surrogatepass")) <= MAX_SHORT_STRING


def _count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT)


def _counts(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict)
        and all(isinstance(key, str) and _count(n) and n is not None for key, n in value.items())
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


#: The headers Celery or the library reads, and what each must be when present.
EXPECTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "task": (_short_string, "an event name: a string of 1 to 255 bytes"),
    "id": (lambda v: v is None or _short_string(v), "a string of 1 to 255 bytes"),
    "ce-id": (lambda v: v is None or _short_string(v), "a string of 1 to 255 bytes"),
    "for_handler": (lambda v: v is None or _short_string(v), "a handler's task name: a string of 1 to 255 bytes"),
    "retries": (_count, f"a count (an integer from 0 to {MAX_COUNT})"),
    "lost_runs": (_count, f"a count (an integer from 0 to {MAX_COUNT})"),
    "section_retries": (_counts, "a table of counts"),
    "failed_section": (_optional(str), "a string"),
    "first_failure_at": (_iso_time, "an ISO-8601 time"),
    "replay_batch": (_count, "a count"),
    "root_id": (_optional(str), "a string"),
    "parent_id": (_optional(str), "a string"),
    "origin": (_optional(str), "a string"),
    "lang": (_optional(str), "a string"),
    "eta": (_iso_time, "an ISO-8601 time"),
    "expires": (_iso_time, "an ISO-8601 time"),
    # "" is a history replay's gate (amqp_events.history.gates).
    "event_key": (lambda v: v is None or v == "" or _short_string(v), "a string of up to 255 bytes"),
    "x-death": (_deaths, "RabbitMQ's dead-lettering history (a list of tables)"),
    "x-delivery-count": (_count, "a count"),
    "event_version": (lambda v: v is None or (_count(v) and v >= 1), "a version (a whole number from 1)"),
}


#: What py-amqp reads a field that holds no other fields as: nothing to walk for depth (a lookup, once per header).
_FLAT = frozenset((str, bytes, int, float, bool, type(None), datetime, Decimal))


def depth(value: Any, limit: int = MAX_HEADER_DEPTH) -> int:
    """How deep ``value`` nests (a scalar is 0), counted up to ``limit + 1`` (deeper is not walked)."""
    kind = type(value)
    if kind in _FLAT:
        return 0
    if kind is dict and limit >= 0 and all(type(child) in _FLAT for child in value.values()):
        return 1 if value else 0  # a table of scalars (a CloudEvent's attributes): nothing to walk
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


def malformed(headers: Mapping[Any, Any], complete: bool = True) -> dict[Any, str]:
    """The headers that are not what they must be, by their names as they came (a name that is not UTF-8 comes
    as bytes), each with what it must be (empty: all fine); ``complete``: also those an event must have (a
    CloudEvent in structured mode, say, has them only once it is read)."""
    wrong = missing(headers) if complete else {}
    for key, value in headers.items():
        if not isinstance(key, str):
            wrong[key] = "a header name must be a UTF-8 string"
        elif type(value) not in _FLAT and depth(value) > MAX_HEADER_DEPTH:  # most are flat: no call
            wrong[key] = f"nested more than {MAX_HEADER_DEPTH} deep"
        elif key in EXPECTED and not EXPECTED[key][0](value):
            wrong[key] = f"must be {EXPECTED[key][1]}, not {_shown(value)}"
    return wrong


def missing(headers: Mapping[Any, Any]) -> dict[Any, str]:
    """The headers every event must have that ``headers`` lacks, each with why."""
    if headers.get("id") is None and headers.get("ce-id") is None:
        return {"id": "is missing: every event has an id (Celery's task id)"}
    return {}


def describe(wrong: Mapping[Any, str]) -> str:
    return "; ".join(sorted(f"header {name!r} {why}" for name, why in wrong.items()))


# -- sizes ---------------------------------------------------------------------------------------------------


def encoded_size(value: Any) -> int:
    """Bytes ``value`` takes in an AMQP field table, as py-amqp writes it (type byte, length, content)."""
    size, todo = 0, [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            size += 5 + len(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, bytes | bytearray):
            size += 5 + len(item)
        elif isinstance(item, Mapping):
            size += 5
            for key, child in item.items():
                size += 1 + len(str(key).encode("utf-8", "surrogatepass"))
                todo.append(child)
        elif isinstance(item, list | tuple):
            size += 5
            todo.extend(item)
        elif isinstance(item, Decimal):
            size += 6
        elif isinstance(item, bool) or item is None:
            size += 2
        elif isinstance(item, int | float | datetime | date):
            size += 9
        else:
            size += 5 + len(str(item))
    return size


def cut_headers(headers: dict[Any, Any], limit: int = MAX_HEADERS_BYTES) -> list[str]:
    """Drop the largest headers (never ``task`` or ``id``, which are short) until the rest take ``limit``
    bytes at most, in place; returns what was dropped, each as ``name (N bytes)``."""
    if at_most(headers) <= limit:  # nothing to cut, known without encoding anything
        return []
    sizes = {key: 1 + len(str(key)) + encoded_size(value) for key, value in headers.items()}
    total, dropped = sum(sizes.values()), []
    for key in sorted(sizes, key=lambda name: -sizes[name]):
        if total <= limit:
            break
        if key in ("task", "id"):
            continue
        del headers[key]
        total -= sizes[key]
        dropped.append(f"{key!r} ({sizes[key]} bytes)")
    return dropped


#: The encoded size of a scalar other than a string: type byte and 8 bytes at most (:func:`encoded_size`).
_SCALAR_SIZE = {int: 9, float: 9, bool: 2, type(None): 2}


def at_most(headers: Mapping[Any, Any]) -> int:
    """A bound from above of what :func:`cut_headers` counts, reading only lengths (a character takes 4 bytes at
    most): a message's headers are mostly short strings and numbers, and then encoding each one costs more than
    the rest of its routing."""
    total = 0
    for key, value in headers.items():
        total += 1 + len(str(key))
        kind = type(value)
        if kind is str:
            total += 5 + 4 * len(value)
        elif kind in _SCALAR_SIZE:
            total += _SCALAR_SIZE[kind]
        else:
            total += encoded_size(value)
    return total


def cut_body(body: bytes, limit: int) -> tuple[bytes, str] | None:
    """``body`` cut to its first bytes when it is over ``limit``, with a note of its size and SHA-256; ``None``
    when it is within the bound."""
    if len(body) <= limit:
        return None
    digest = hashlib.sha256(body).hexdigest()
    kept = body[:KEPT_BODY_BYTES]
    return kept, f"body cut to its first {len(kept)} of {len(body)} bytes (sha256 {digest})"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def decoding_reason(exc: Exception) -> Reason:
    """Why a body that cannot be decoded is archived."""
    if isinstance(exc, ContentDisallowed):
        return Reason.FORBIDDEN_CONTENT_TYPE
    if isinstance(exc, TooLarge):
        return Reason.TOO_LARGE
    if isinstance(exc, Refused):
        return Reason(exc.reason)
    return Reason.UNDECODABLE


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
