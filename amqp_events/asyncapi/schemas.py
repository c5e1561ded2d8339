"""JSON Schemas of event payloads, from what the code already says: signatures, dataclasses, pydantic models.

An event's payload is the object of its keyword arguments (a CloudEvent's
data; the second item of a Celery task body). Its schema comes from the
validating function of ``@app.event``, the fields of an event class, or the
handler's signature. Pydantic models describe themselves
(``model_json_schema``); their definitions are hoisted into ``definitions``,
so that references resolve inside the AsyncAPI document's components.
Everything here is pure.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import inspect
import types
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

#: Where hoisted definitions live in the AsyncAPI document.
REF_TEMPLATE = "#/components/schemas/{model}"

_SIMPLE: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    dt.datetime: {"type": "string", "format": "date-time"},
    dt.date: {"type": "string", "format": "date"},
    dt.time: {"type": "string", "format": "time"},
    uuid.UUID: {"type": "string", "format": "uuid"},
    Decimal: {"type": "string", "description": "a decimal number, as text"},  # kombu's JSON writes it so
    bytes: {"type": "string"},
}


def payload_schema(target: Any, skip: int = 0, definitions: dict[str, Any] | None = None) -> dict[str, Any]:
    """The schema of the keyword arguments ``target`` takes: a function (its first ``skip`` parameters
    left out), a dataclass or a pydantic model. Definitions a model refers to go into ``definitions``."""
    definitions = {} if definitions is None else definitions
    if isinstance(target, type) and callable(getattr(target, "model_json_schema", None)):
        return _pydantic(target, definitions)
    if isinstance(target, type) and dataclasses.is_dataclass(target):
        hints = _hints(target)
        parameters = [(field.name, hints.get(field.name, field.type), _has_default(field)) for field in _fields(target)]
        return _object(parameters, False, definitions)
    return _signature_schema(target, skip, definitions)


def annotation_schema(annotation: Any, definitions: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of values of ``annotation`` as they travel in JSON (``{}``: anything)."""
    if annotation in (inspect.Parameter.empty, Any, object):
        return {}
    if annotation in _SIMPLE:
        return dict(_SIMPLE[annotation])
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [annotation_schema(arg, definitions) for arg in args]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin is typing.Annotated:
        return annotation_schema(args[0], definitions)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [member.value for member in annotation]}
    if annotation in (list, tuple, set, frozenset) or _subclass(origin, (Sequence, set, frozenset)):
        array: dict[str, Any] = {"type": "array"}
        if args and (origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)):
            array["items"] = annotation_schema(args[0], definitions)
        return array
    if annotation is dict or _subclass(origin, (Mapping,)):
        values = args[1] if len(args) == 2 else inspect.Parameter.empty
        return {"type": "object", **({"additionalProperties": annotation_schema(values, definitions)} if args else {})}
    if isinstance(annotation, type) and (
        dataclasses.is_dataclass(annotation) or callable(getattr(annotation, "model_json_schema", None))
    ):
        definitions[annotation.__name__] = payload_schema(annotation, definitions=definitions)
        return {"$ref": REF_TEMPLATE.format(model=annotation.__name__)}
    return {"description": f"a {getattr(annotation, '__name__', annotation)}, as JSON"}


def _signature_schema(function: Callable[..., Any], skip: int, definitions: dict[str, Any]) -> dict[str, Any]:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin or an odd callable: say nothing rather than guess
        return {"type": "object"}
    hints = _hints(function)
    parameters, open_ended = [], False
    for parameter in list(signature.parameters.values())[skip:]:
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            open_ended = True
        elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
            annotation = hints.get(parameter.name, parameter.annotation)
            parameters.append((parameter.name, annotation, parameter.default is not inspect.Parameter.empty))
    return _object(parameters, open_ended, definitions)


def _object(parameters: list[tuple[str, Any, bool]], open_ended: bool, definitions: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {name: annotation_schema(annotation, definitions) for name, annotation, _ in parameters},
    }
    required = [name for name, _, has_default in parameters if not has_default]
    if required:
        schema["required"] = required
    if not open_ended:
        schema["additionalProperties"] = False
    return schema


def _pydantic(model: Any, definitions: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = model.model_json_schema(ref_template=REF_TEMPLATE)
    definitions.update(schema.pop("$defs", {}))
    return schema


def _hints(target: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception:  # a name the annotations use is not importable here: fall back to what is written
        return {}


def _fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [field for field in dataclasses.fields(cls) if field.init]


def _has_default(field: dataclasses.Field[Any]) -> bool:
    return field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING


def _subclass(origin: Any, bases: tuple[type, ...]) -> bool:
    return isinstance(origin, type) and issubclass(origin, bases) and not issubclass(origin, (str, bytes))
