"""The AsyncAPI 3.0 document of a service (:mod:`~amqp_events.asyncapi.document`), with the JSON Schemas of its
payloads made from signatures, dataclasses and pydantic models (:mod:`~amqp_events.asyncapi.schemas`). Pure."""
