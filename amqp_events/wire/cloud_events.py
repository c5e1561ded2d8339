"""CloudEvents on the events exchange: reading them into the library's messages, and firing them.

A producer in any language fires a CloudEvent (specversion 1.0) to the events
exchange with the event name as routing key, in either content mode:

* **binary**: the attributes in headers prefixed ``ce-`` (the RabbitMQ and
  Knative convention; the AMQP binding's ``cloudEvents_`` and ``cloudEvents:``
  are accepted too), the data as the body, its media type as the message's
  content type;
* **structured**: content type ``application/cloudevents+json``, the whole
  event as a JSON object in the body.

When such a message reaches a worker it is read (with the ``cloudevents``
SDK, the ``[cloudevents]`` extra) into the library's own message before
anything else looks at it (:mod:`amqp_events.middleware.cloud_events`):

================ ======================= ===========================================
CloudEvents      the library             note
================ ======================= ===========================================
``type``         event name (``task``)   the handler that runs it
``id``           event id (``id``)       1 to 64 characters (the inbox's key)
``source``       ``fired_by``
``time``         ``fired_at``            optional
``data``         keyword arguments       a JSON object (absent: no arguments)
``partitionkey`` ``event_key``           the event's key (the Partitioning extension)
``eventversion`` ``event_version``       the version of its arguments (absent: 1)
everything       ``cloudevent`` header   kept for the archive: ``archive show``
================ ======================= ===========================================

From there on it is an ordinary event message: its retries, delays, archived
copy and replays are in the library's form, carrying the ``cloudevent``
header. A CloudEvent that cannot be read is archived as it arrived, with a
reason: ``invalid_cloudevent`` (a required attribute missing, a specversion
other than 1.0, an attribute of the wrong form), ``forbidden_content_type``
(data that is not JSON), ``undecodable`` (JSON data that does not parse) or
``bad_arguments`` (JSON data that is not an object).

Firing as CloudEvents (``amqp_events_wire_format="cloudevents"``, or per event) publishes binary mode: ``ce-``
headers and the keyword arguments as a JSON object, read by any CloudEvents SDK and as above. Pure: no I/O.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from amqp_events.errors import Refused
from amqp_events.wire.message import (
    EMPTY_EMBED,
    EVENT_KEY,
    EVENT_VERSION,
    FIRED_AT,
    FIRED_BY,
    JSON,
    Reason,
    isoformat,
    json_body,
)

#: The header a CloudEvent's attributes are kept in once read into the library's message.
CLOUDEVENT = "cloudevent"
SPECVERSION = "1.0"
STRUCTURED = "application/cloudevents+json"
#: Header prefixes of binary mode: RabbitMQ's convention first, then the AMQP binding's two.
PREFIXES = ("ce-", "cloudEvents_", "cloudEvents:")
REQUIRED = ("specversion", "id", "source", "type")
#: The Partitioning extension's attribute: the event's key.
PARTITION_KEY = "partitionkey"
VERSION_ATTRIBUTE = "eventversion"  # the version of the arguments (event_version; absent: 1)
#: The wire formats an app or an event fires in.
WIRE_FORMATS = ("celery", "cloudevents")
#: JSON media types, as the CloudEvents JSON format recognises them (``application/json``, ``text/json``,
#: ``application/vnd.x+json``, with parameters).
_JSON_MEDIA_TYPE = re.compile(r"^(application|text)/([a-zA-Z0-9\-\.]+\+)?json(;.*)?$")
_MAX_ID = 64
#: The attributes binary mode usually carries, read here as the SDK would read them but without building its event
#: (nobody reads that event: the attributes become headers, the data the body as it came).
_PLAIN_ATTRIBUTES = frozenset(
    ("specversion", "id", "source", "type", "time", "subject", PARTITION_KEY, VERSION_ATTRIBUTE, "traceparent")
)
#: RFC 3339's date-time, in the forms ``datetime.fromisoformat`` of every supported Python reads as the SDK does.
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3}|\.\d{6})?(Z|[+-]\d\d:\d\d)\Z")
_EMBED_JSON = json_body(EMPTY_EMBED)
_EXTRAS = "install 'celery-amqp-events[cloudevents]>=0.3' to read CloudEvents"


@dataclass(frozen=True)
class ReadEvent:
    """A CloudEvent read into the library's terms."""

    attributes: dict[str, str]
    kwargs: dict[str, Any]
    #: The data as it came, when it is the JSON object ``kwargs`` was read from: the body is built around it.
    data: bytes | None = None

    @property
    def headers(self) -> dict[str, Any]:
        """The event message's headers (plus whatever else the message carried, kept by the caller)."""
        headers: dict[str, Any] = {
            "task": self.attributes["type"],
            "id": self.attributes["id"],
            FIRED_BY: self.attributes["source"],
            CLOUDEVENT: dict(self.attributes),
        }
        if "time" in self.attributes:
            headers[FIRED_AT] = self.attributes["time"]
        if self.attributes.get(PARTITION_KEY):
            headers[EVENT_KEY] = self.attributes[PARTITION_KEY]
        if (version := self.attributes.get(VERSION_ATTRIBUTE)) is not None:  # not a whole number: the checks refuse it
            headers[EVENT_VERSION] = int(version) if str(version).isdigit() else version
        return headers

    @property
    def body(self) -> bytes:
        if self.data is not None:  # parsed whole as one JSON object: nothing outside it can change the body's shape
            return b"[[], " + self.data + b", " + _EMBED_JSON + b"]"
        return json_body([[], self.kwargs, EMPTY_EMBED])


def is_cloud_event(headers: Mapping[str, Any], content_type: str | None) -> bool:
    """Does this message arrive as a CloudEvent (rather than in the library's own form)?

    A message in the library's form has a ``task`` header; one read from a
    CloudEvent before carries it too, so it is never read twice.
    """
    if "task" in headers:
        return False
    if _media_type(content_type).startswith("application/cloudevents"):
        return True
    return any(key.startswith(PREFIXES) for key in headers)


def read(headers: Mapping[str, Any], body: bytes, content_type: str | None) -> ReadEvent:
    """The CloudEvent in a message, in the library's terms; :class:`~amqp_events.errors.Refused` says why not."""
    plainly = _read_plainly(headers, body, content_type)
    if plainly is not None:
        return plainly[0]
    return _read(_split(headers)[0], body, content_type, _media_type(content_type))


def as_event_message(
    headers: Mapping[str, Any], body: bytes, content_type: str | None
) -> tuple[dict[str, Any], bytes] | None:
    """The headers and JSON body of a CloudEvent read into the library's form, its other headers kept;
    ``None`` for a message that is not a CloudEvent. Raises :class:`~amqp_events.errors.Refused` for one
    that cannot be read (it is then archived as it arrived)."""
    if "task" in headers:  # the library's own form (or read from a CloudEvent before)
        return None
    plainly = _read_plainly(headers, body, content_type)
    if plainly is not None:
        event, kept = plainly
    else:
        media_type = _media_type(content_type)
        prefixed, kept = _split(headers)
        if not prefixed and not media_type.startswith("application/cloudevents"):
            return None
        event = _read(prefixed, body, content_type, media_type)
    if "traceparent" in event.attributes:  # the distributed tracing extension: the same W3C context
        kept.setdefault("traceparent", event.attributes["traceparent"])
    return {**kept, **event.headers}, event.body


def _read(prefixed: dict[str, Any], body: bytes, content_type: str | None, media_type: str) -> ReadEvent:
    """:func:`read`, given the attribute headers (:func:`_split`) and the media type."""
    try:
        sdk = _sdk()
    except ImportError:
        raise Refused(Reason.UNDECODABLE, f"the message is a CloudEvent: {_EXTRAS}") from None
    amqp, rabbitmq, json_format, CloudEvent = sdk.amqp, sdk.rabbitmq, sdk.json_format, sdk.CloudEvent
    structured = media_type.startswith("application/cloudevents")
    if structured and media_type != STRUCTURED:
        raise Refused(Reason.FORBIDDEN_CONTENT_TYPE, f"CloudEvents in {media_type!r} are not read, only {STRUCTURED}")
    attributes = _structured_attributes(body) if structured else _binary_attributes(prefixed)
    _check_required(attributes)
    datacontenttype = str(attributes.get("datacontenttype") or content_type or JSON)
    if not _JSON_MEDIA_TYPE.match(datacontenttype):
        raise Refused(
            Reason.FORBIDDEN_CONTENT_TYPE, f"the CloudEvent's data is {datacontenttype!r}: only JSON data is accepted"
        )
    try:
        if structured:
            event = rabbitmq.from_structured(rabbitmq.RabbitMQMessage({}, content_type, body), json_format, CloudEvent)
        elif not any(key.startswith("ce-") for key in prefixed):  # the AMQP binding's prefixes
            in_amqp = amqp.AMQPMessage({"content-type": datacontenttype}, prefixed, body)
            event = amqp.from_binary(in_amqp, json_format, CloudEvent)
        else:
            in_rabbitmq = rabbitmq.RabbitMQMessage(_as_strings(prefixed), datacontenttype, body)
            event = rabbitmq.from_binary(in_rabbitmq, json_format, CloudEvent)
    except (sdk.BaseCloudEventException, ValueError, TypeError, OverflowError) as exc:
        raise Refused(Reason.INVALID_CLOUDEVENT, f"not a valid CloudEvent {SPECVERSION}: {exc}") from None
    read_attributes = _attribute_strings(event.get_attributes())
    if "time" not in attributes:  # the SDK makes one up (now): an event that says no time was fired at no known time
        del read_attributes["time"]
    return ReadEvent(read_attributes, _kwargs(event.get_data(), body, structured))


def attributes_of(headers: Mapping[str, Any], body: bytes, content_type: str | None) -> dict[str, str]:
    """A message's CloudEvents attributes as far as they can be read (for showing archived messages)."""
    kept = headers.get(CLOUDEVENT)
    if isinstance(kept, Mapping):
        return {str(key): str(value) for key, value in kept.items()}
    if not is_cloud_event(headers, content_type):
        return {}
    if _media_type(content_type) == STRUCTURED:
        try:
            return _attribute_strings(_structured_attributes(body))
        except Refused:
            return {}
    return _attribute_strings(_binary_attributes(_split(headers)[0]))


def binary_headers(
    name: str, event_id: str, source: str, time: datetime, key: str | None = None, version: int = 1
) -> dict[str, str]:
    """The ``ce-`` headers of an event fired in binary mode, written by the SDK (its data is the JSON body);
    its ``key`` as the Partitioning extension's ``partitionkey``, a ``version`` after 1 as ``eventversion``."""
    try:
        sdk = _sdk()
    except ImportError:
        raise ImportError("install 'celery-amqp-events[cloudevents]>=0.3' to fire CloudEvents") from None
    attributes: dict[str, Any] = {
        "specversion": SPECVERSION,
        "id": event_id,
        "source": source,
        "type": name,
        "time": time,
    }
    if key is not None:
        attributes[PARTITION_KEY] = key
    if version > 1:
        attributes[VERSION_ATTRIBUTE] = version
    headers: dict[str, str] = sdk.rabbitmq.to_binary(sdk.CloudEvent(attributes), sdk.json_format).headers
    return headers


@functools.cache
def _sdk() -> SimpleNamespace:
    """The parts of the ``cloudevents`` SDK used here, imported once (ImportError without the extra)."""
    from cloudevents.core.bindings import amqp, rabbitmq
    from cloudevents.core.exceptions import BaseCloudEventException
    from cloudevents.core.formats.json import JSONFormat
    from cloudevents.core.v1.event import CloudEvent

    return SimpleNamespace(
        amqp=amqp,
        rabbitmq=rabbitmq,
        json_format=JSONFormat(),
        CloudEvent=CloudEvent,
        BaseCloudEventException=BaseCloudEventException,
    )


def check_wire_format(wire_format: str) -> str:
    if wire_format not in WIRE_FORMATS:
        raise ValueError(f"wire_format must be one of {', '.join(WIRE_FORMATS)}, not {wire_format!r}")
    return wire_format


# -- reading attributes ---------------------------------------------------------------------------------


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _split(headers: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Binary mode's attribute headers (as text where they came as bytes or a timestamp), and the other headers."""
    prefixed: dict[str, Any] = {}
    others: dict[str, Any] = {}
    for key, value in headers.items():
        if key.startswith(PREFIXES):
            prefixed[key] = value if type(value) is str else _plain(value)
        else:
            others[key] = value
    if any(key.startswith("ce-") for key in prefixed):  # RabbitMQ's: the AMQP binding's beside it are not read
        prefixed = {key: value for key, value in prefixed.items() if key.startswith("ce-")}
    return prefixed, others


def _binary_attributes(prefixed: Mapping[str, Any]) -> dict[str, Any]:
    """Attribute names and values of the headers :func:`_split` found."""
    return {_unprefixed(key): value for key, value in prefixed.items()}


def _unprefixed(key: str) -> str:
    return key[3 if key.startswith("ce-") else 12 :].lower()  # the AMQP binding's two prefixes are as long


def _read_plainly(
    headers: Mapping[str, Any], body: bytes, content_type: str | None
) -> tuple[ReadEvent, dict[str, Any]] | None:
    """Binary mode's common case in one pass over the headers, read to what the SDK's reading gives (with its
    other headers): ``ce-`` headers of the attributes above only, as non-empty text, the required ones there, a
    time in RFC 3339, and JSON data. ``None`` for anything else: the SDK reads it then, and says what is wrong."""
    try:
        _sdk()
    except ImportError:  # without the extra nothing is read: the general path says so, or that it is no CloudEvent
        return None
    attributes: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    for key, value in headers.items():
        if key.startswith("ce-"):
            name = key[3:]
            if name not in _PLAIN_ATTRIBUTES or type(value) is not str or not value:
                return None  # an attribute the SDK has rules of its own for, or not plainly text
            attributes[name] = value
        elif key.startswith(PREFIXES):  # the AMQP binding's prefixes
            return None
        else:
            kept[key] = value
    datacontenttype = content_type or JSON
    if (
        _required_problem(attributes) is not None
        or not _JSON_MEDIA_TYPE.match(datacontenttype)
        or _media_type(datacontenttype).startswith("application/cloudevents")  # structured mode
    ):
        return None
    time = attributes.get("time")
    try:
        if time is not None:
            if not _RFC3339.match(time):
                return None
            attributes["time"] = isoformat(datetime.fromisoformat(time.replace("Z", "+00:00")))
        data = json.loads(body.decode("utf-8")) if body else None
    except ValueError:  # no such day or time, or data that is not JSON (UnicodeDecodeError is one)
        return None
    attributes["datacontenttype"] = datacontenttype
    return ReadEvent(attributes, _kwargs(data, body, False), body if isinstance(data, dict) else None), kept


def _structured_attributes(body: bytes) -> dict[str, Any]:
    try:
        event = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(Reason.UNDECODABLE, f"a structured CloudEvent whose body is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise Refused(Reason.INVALID_CLOUDEVENT, "a structured CloudEvent must be a JSON object")
    return {key: value for key, value in event.items() if key not in ("data", "data_base64")}


def _check_required(attributes: Mapping[str, Any]) -> None:
    problem = _required_problem(attributes)
    if problem is not None:
        raise Refused(Reason.INVALID_CLOUDEVENT, problem)


def _required_problem(attributes: Mapping[str, Any]) -> str | None:
    """What is wrong with a CloudEvent's required attributes, if anything."""
    missing = [name for name in REQUIRED if attributes.get(name) in (None, "")]
    if missing:
        return f"the CloudEvent has no {', '.join(repr(name) for name in missing)} (required: {', '.join(REQUIRED)})"
    if attributes["specversion"] != SPECVERSION:
        return f"CloudEvents specversion {attributes['specversion']!r} is not supported (only {SPECVERSION!r})"
    if len(str(attributes["id"])) > _MAX_ID:
        return f"the CloudEvent's id is {len(str(attributes['id']))} characters long: at most {_MAX_ID} are kept"
    return None


def _kwargs(data: Any, body: bytes, structured: bool) -> dict[str, Any]:
    if data is None:
        return {}
    if isinstance(data, dict):
        return data
    if isinstance(data, (bytes, bytearray)):
        raise Refused(Reason.FORBIDDEN_CONTENT_TYPE, "the CloudEvent's data is binary (data_base64): JSON expected")
    if isinstance(data, str) and not structured:  # the SDK hands over text it could not parse as JSON
        try:
            json.loads(body)
        except ValueError as exc:
            raise Refused(Reason.UNDECODABLE, f"the CloudEvent's data is not valid JSON: {exc}") from None
    raise Refused(
        Reason.BAD_ARGUMENTS,
        f"the CloudEvent's data must be a JSON object (the handler's keyword arguments), not {type(data).__name__}",
    )


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, datetime):
        return isoformat(value)
    return value


def _as_strings(headers: Mapping[str, Any]) -> dict[str, str]:
    return {key: value if isinstance(value, str) else str(value) for key, value in headers.items()}


def _attribute_strings(attributes: Mapping[str, Any]) -> dict[str, str]:
    return {
        str(key): isoformat(value) if isinstance(value, datetime) else str(value)
        for key, value in attributes.items()
        if value is not None
    }
