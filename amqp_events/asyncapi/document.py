"""An AsyncAPI 3.0 document of one service: the events it fires and handles, where they travel, their payloads.

* **channels**: each event the service fires or handles, as a routing key
  on the events exchange; each queue of the service (``<service>:<event>``).
* **operations**: ``send`` for each event fired (``@app.event``), in the
  service's wire format; ``receive`` for each event handled, from its queue.
* **messages**: each event in both wire formats a worker reads: the Celery
  task message (body ``[args, kwargs, embed]``) and the CloudEvent in binary
  mode (``ce-`` headers, the keyword arguments as data). Their payload schema
  (``components.schemas``) comes from the event's signature, dataclass or
  pydantic model (:mod:`amqp_events.asyncapi.schemas`).

Built from the service alone (no broker); ``amqp-events -A APP asyncapi`` prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from amqp_events.asyncapi.schemas import payload_schema
from amqp_events.core.context import ServiceContext
from amqp_events.core.events import Event
from amqp_events.core.versions import handled_version
from amqp_events.topology import delays
from amqp_events.topology.names import SLOTS, ordered_exchange_name
from amqp_events.transport.inspection import address_of, vhost_of
from amqp_events.wire.message import DUE_AT, EVENT_KEY, EVENT_SLOT, FIRED_AT, FIRED_BY

VERSION = "3.0.0"
#: The version of the AsyncAPI AMQP bindings used.
AMQP_BINDINGS = "0.3.0"
SERVER = "rabbitmq"
#: The two wire formats, as message name suffixes.
FORMATS = {"celery": "", "cloudevents": ".cloudevent"}


def document(
    context: ServiceContext, declared: Mapping[str, Any], broker_url: str, api_version: str = "1.0.0"
) -> dict[str, Any]:
    """The AsyncAPI document of ``context``'s service, which fires the ``declared`` events (``@app.event``,
    by name) on the broker at ``broker_url``, as plain data (dump it as JSON or YAML)."""
    settings, service = context.settings, context.name
    vhost = vhost_of(broker_url)
    fired = dict(declared)
    handled = context.handlers
    definitions: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for name in sorted({*fired, *handled}):
        if name in fired:
            schemas[name] = payload_schema(_payload_target(fired[name]), definitions=definitions)
        else:
            handler = handled[name]
            target = handler.event_class or handler.function
            skip = 0 if handler.event_class else handler.leading_parameters  # self, the inbox's session
            schemas[name] = payload_schema(target, skip=skip, definitions=definitions)

    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for name in schemas:
        messages.update(_messages(name, _key_of(fired.get(name))))
        exchange = {"name": settings.exchange, "type": "topic", "durable": True, "autoDelete": False, "vhost": vhost}
        channels[name] = {
            "address": name,
            "title": f"{name} on the {settings.exchange!r} exchange",
            "description": "Events fired with a delay arrive through the delay ladder instead: bind a queue to "
            f"the {delays.DELIVERY_EXCHANGE!r} exchange with {_delayed_pattern(name)!r} as well to receive them.",
            "messages": _references(name),
            "bindings": {"amqp": {"is": "routingKey", "exchange": exchange, "bindingVersion": AMQP_BINDINGS}},
        }
        if name in fired:
            wire_format = _wire_format_of(fired[name]) or settings.wire_format
            message = name + FORMATS[wire_format]
            operations[f"fire.{name}"] = {
                "action": "send",
                "channel": {"$ref": f"#/channels/{name}"},
                "summary": f"{service} fires {name} ({wire_format} wire format), with a publisher confirm.",
                "messages": [{"$ref": f"#/channels/{name}/messages/{message}"}],
                # The version of its arguments (the event_version header; 1 is not sent).
                "x-event-version": context.event_versions.get(name, 1),
                "bindings": {"amqp": {"deliveryMode": 2, "mandatory": True, "bindingVersion": AMQP_BINDINGS}},
            }
        if name in handled:
            handler = handled[name]
            if handler.ordered:  # one channel per event: its partitions are shared with other events
                ordered = ordered_exchange_name(service)
                queue = f"{ordered}:{name}"
                channels[queue] = _ordered_channel(service, name, ordered, vhost, settings.partitions)
            else:
                queue = handler.queue
                channels[queue] = _queue_channel(service, name, queue, vhost)
            operations[f"handle.{name}"] = {
                "action": "receive",
                "channel": {"$ref": f"#/channels/{queue}"},
                "summary": f"{service} handles {name} with {handled[name].name} (either wire format).",
                # The version of the arguments it takes, and those its upcasters turn into it.
                "x-event-version": handled_version(handler),
                "x-upcasts-from": sorted(handler.options.get("upcasters") or ()),
                "messages": [{"$ref": f"#/channels/{queue}/messages/{message}"} for message in _references(name)],
                "bindings": {"amqp": {"ack": True, "bindingVersion": AMQP_BINDINGS}},
            }
    return {
        "asyncapi": VERSION,
        "info": {
            "title": service,
            "version": api_version,
            "description": f"The events the service {service!r} fires and handles (celery-amqp-events).",
        },
        "defaultContentType": "application/json",
        "servers": {
            SERVER: {
                "host": address_of(broker_url),
                "protocol": "amqp",
                "protocolVersion": "0.9.1",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": {**definitions, **schemas}},
    }


def _queue_channel(service: str, name: str, queue: str, vhost: str) -> dict[str, Any]:
    return {
        "address": queue,
        "title": f"the queue of {name} in {service}",
        "description": "A quorum queue bound to the exchange by the event's name. Retries come back to it "
        "through the broker's delay queues; messages that run out of retries go to "
        f"{service}.archive.",
        "messages": _references(name),
        "bindings": {
            "amqp": {
                "is": "queue",
                "queue": {"name": queue, "durable": True, "exclusive": False, "autoDelete": False, "vhost": vhost},
                "bindingVersion": AMQP_BINDINGS,
            }
        },
    }


def _ordered_channel(service: str, name: str, exchange: str, vhost: str, partitions: int) -> dict[str, Any]:
    return {
        "address": exchange,
        "title": f"{name} handled in order per key by {service}",
        "description": f"The events exchange sends {name} on to {exchange}, a headers exchange that puts every "
        f"event of one key into the same one of {partitions} partitions, {exchange}.00 and on (quorum queues "
        f"with a single active consumer each), by its key's slot: the {EVENT_SLOT} header, the CRC-32 of the "
        f"key ({EVENT_KEY}) modulo {SLOTS}. An event without it goes to {exchange}.intake, where a worker adds "
        "it. Retries wait in the worker, in place; an event that runs out of retries goes to "
        f"{service}.archive, and the later events of its key wait until it is replayed or discarded.",
        "messages": _references(name),
        "bindings": {
            "amqp": {
                "is": "routingKey",
                "exchange": {"name": exchange, "durable": True, "autoDelete": False, "vhost": vhost},
                "bindingVersion": AMQP_BINDINGS,
            }
        },
    }


def _delayed_pattern(name: str) -> str:
    return delays.destination_pattern(delays.event_destination(name))


def _references(name: str) -> dict[str, Any]:
    """A channel's messages: the event in each wire format."""
    return {name + suffix: {"$ref": f"#/components/messages/{name + suffix}"} for suffix in FORMATS.values()}


def _payload_target(fireable: Any) -> Any:
    """What describes a fired event's payload: the validating function, or the event class."""
    return fireable.validate if isinstance(fireable, Event) else fireable


def _wire_format_of(fireable: Any) -> str | None:
    return getattr(fireable, "wire_format", None) or getattr(fireable, "event_wire_format", None)


def _key_of(fireable: Any) -> str | None:
    """How a declared event's key is given: ``argument order_id``, or the callable's name."""
    key = getattr(fireable, "key", None) or getattr(fireable, "event_key", None)
    if key is None:
        return None
    return f"the argument {key!r}" if isinstance(key, str) else f"{getattr(key, '__qualname__', key)}(...)"


def _messages(name: str, key: str | None = None) -> dict[str, Any]:
    """The event's messages in both wire formats; ``key`` says where a declared key comes from."""
    payload = {"$ref": f"#/components/schemas/{name}"}
    key_header = {
        "type": "string",
        "maxLength": 255,
        "description": "the aggregate the event belongs to" + (f": {key}" if key else " (if it has a key)"),
    }
    celery = {
        "name": name,
        "title": f"{name} (Celery task message)",
        "contentType": "application/json",
        "headers": {
            "type": "object",
            "properties": {
                "task": {"const": name, "description": "the event's name"},
                "id": {"type": "string", "description": "the event id"},
                FIRED_AT: {"type": "string", "format": "date-time"},
                FIRED_BY: {"type": "string", "description": "the service that fired it"},
                "retries": {"type": "integer", "minimum": 0},
                DUE_AT: {"type": "string", "format": "date-time", "description": "a delayed copy's due time"},
                EVENT_KEY: key_header,
                EVENT_SLOT: {
                    "type": "string",
                    "pattern": "^[0-9]{1,2}$",
                    "description": f"with a key: the CRC-32 of its UTF-8 bytes modulo {SLOTS}, in decimal (optional: "
                    "without it, an ordered handler's worker works it out, for one more trip through the broker)",
                },
            },
            "required": ["task", "id", *([EVENT_KEY] if key else [])],
        },
        "payload": {
            "type": "array",
            "description": "Celery's task body: [args, kwargs, embed]; the keyword arguments carry the payload.",
            "items": [
                {"type": "array", "description": "positional arguments, in the signature's order"},
                payload,
                {"type": "object", "description": "Celery's callbacks, errbacks, chain and chord (unused)"},
            ],
            "minItems": 3,
            "maxItems": 3,
        },
        "correlationId": {"location": "$message.header#/id"},
    }
    cloud_event = {
        "name": name + FORMATS["cloudevents"],
        "title": f"{name} (CloudEvent, binary content mode)",
        "contentType": "application/json",
        "headers": {
            "type": "object",
            "properties": {
                "ce-specversion": {"const": "1.0"},
                "ce-type": {"const": name},
                "ce-id": {"type": "string", "maxLength": 64},
                "ce-source": {"type": "string", "description": "the service that fired it"},
                "ce-time": {"type": "string", "format": "date-time"},
                "ce-partitionkey": key_header,
            },
            "required": ["ce-specversion", "ce-type", "ce-id", "ce-source", *(["ce-partitionkey"] if key else [])],
        },
        "payload": payload,
        "correlationId": {"location": "$message.header#/ce-id"},
    }
    return {name: celery, name + FORMATS["cloudevents"]: cloud_event}
