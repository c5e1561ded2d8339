"""The fleet's event contracts (``amqp-events contracts check``): documents made from real apps' signatures, each kind
of change judged from the consumer's side; and the schema comparison over whole spaces of payload schemas."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from amqp_events import events_app
from amqp_events.asyncapi.document import document
from amqp_events.contracts.at_rest import AtRest, judge
from amqp_events.contracts.fleet import Contract, Finding, check, read
from amqp_events.contracts.schemas import accepts

URL = "amqp://guest:guest@localhost:5672/"
EVENT = "billing.invoice.paid"


def fires(fired: Callable[..., Any] | None, version: int = 1) -> dict[str, Any]:
    """The document of ``billing``, firing the event with ``fired``'s signature (``None``: not at all)."""
    app = events_app("billing", broker_url=URL)
    if fired is not None:
        app.event(EVENT, version=version)(fired)
    return document(app.context, app.declared_events, URL)


def handles(handler: Callable[..., Any] | None, **options: Any) -> dict[str, Any]:
    """The document of ``shipping``, handling the event with ``handler`` (``None``: not at all)."""
    app = events_app("shipping", broker_url=URL)
    if handler is not None:
        app.handler(EVENT, **options)(handler)
    return document(app.context, app.declared_events, URL)


def fleet(fired: Callable[..., Any] | None, handler: Callable[..., Any] | None) -> list[Contract]:
    return [read(fires(fired)), read(handles(handler))]


def judged(before: list[Contract], after: list[Contract]) -> list[tuple[bool, str]]:
    return [(finding.breaking, finding.change) for finding in check(before, after)]


def breaking(findings: list[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.breaking]


def paid(invoice_id: int, amount: str) -> None: ...


def paid_with_currency(invoice_id: int, amount: str, currency: str = "EUR") -> None: ...


def paid_renamed(invoice_id: int, total: str) -> None: ...


def paid_as_number(invoice_id: int, amount: float) -> None: ...


def on_paid(invoice_id: int, amount: str) -> None: ...


def on_paid_open(invoice_id: int, amount: str, **extra: Any) -> None: ...


def on_paid_with_currency(invoice_id: int, amount: str, currency: str = "EUR") -> None: ...


def on_paid_needing_currency(invoice_id: int, amount: str, currency: str) -> None: ...


def on_paid_total(invoice_id: int, total: str) -> None: ...


def on_paid_int(invoice_id: int, amount: int) -> None: ...


def on_paid_any_number(invoice_id: float, amount: str) -> None: ...


BASELINE = fleet(paid, on_paid)


def test_no_change_is_no_finding():
    assert check(BASELINE, fleet(paid, on_paid)) == []


def test_a_removed_or_renamed_argument_a_handler_needs_breaks_it():
    [found] = check(BASELINE, fleet(paid_renamed, on_paid))
    assert (found.breaking, found.producer, found.consumer) == (True, "billing", f"shipping/{EVENT}")
    assert found.change == "fired with other arguments"
    assert "amount: required, and not sent" in found.why and "total: sent, and not taken" in found.why


def test_a_new_argument_breaks_a_handler_without_it_unless_it_takes_any_keyword():
    [found] = check(BASELINE, fleet(paid_with_currency, on_paid))
    assert found.breaking and found.why == ("currency: sent, and not taken",)
    open_handler = fleet(paid, on_paid_open)
    assert not breaking(check(open_handler, fleet(paid_with_currency, on_paid_open)))


def test_a_new_required_argument_without_a_default_breaks_and_with_a_default_does_not():
    [found] = check(BASELINE, fleet(paid, on_paid_needing_currency))
    assert found.breaking and found.change == "its handler takes other arguments"
    assert found.why == ("currency: required, and not sent",)
    assert judged(BASELINE, fleet(paid, on_paid_with_currency)) == [(False, "its handler takes other arguments")]


def test_a_narrowed_type_breaks_and_a_widened_one_does_not():
    [found] = check(BASELINE, fleet(paid, on_paid_int))
    assert found.breaking and found.why == ("amount: string where integer is taken",)
    assert judged(BASELINE, fleet(paid, on_paid_any_number)) == [(False, "its handler takes other arguments")]
    assert breaking(check(BASELINE, fleet(paid_as_number, on_paid)))  # the producer's type, wider than taken


def test_an_event_with_subscribers_no_longer_fired_breaks_them_and_one_without_breaks_nobody():
    assert judged(BASELINE, fleet(None, on_paid)) == [
        (True, "no longer fired by any service"),
        (False, "no longer fired by this service"),
    ]
    assert judged(fleet(paid, None), fleet(None, None)) == [(False, "no longer fired by this service")]


def test_new_events_handlers_and_removed_handlers_break_nobody():
    assert judged(fleet(None, None), fleet(paid, None)) == [(False, "newly fired")]
    assert judged(fleet(paid, None), BASELINE) == [(False, "new handler")]
    assert judged(BASELINE, fleet(paid, None)) == [(False, "handler removed")]


def test_a_rename_on_both_sides_at_once_still_breaks_the_events_at_rest():
    findings = check(BASELINE, fleet(paid_renamed, on_paid_total))
    assert [(f.breaking, f.change) for f in breaking(findings)] == [
        (True, "events fired before, at rest, would be refused")
    ]
    assert "total: required, and not sent" in findings[0].why


def test_a_handler_that_upcasts_version_1_takes_its_events_live_and_at_rest_then_version_2():
    def v1_to_v2(arguments: dict[str, Any]) -> dict[str, Any]:
        return {"invoice_id": arguments["invoice_id"], "total": arguments["amount"]}

    consumer_first = [read(fires(paid)), read(handles(on_paid_total, upcasters={1: v1_to_v2}))]
    assert judged(BASELINE, consumer_first) == [(False, "its handler takes other arguments")]
    producer_next = [read(fires(paid_renamed, version=2)), consumer_first[1]]
    assert judged(consumer_first, producer_next) == [(False, "fired with other arguments")]
    without_upcaster = [read(fires(paid)), read(handles(on_paid_total))]
    assert breaking(check(BASELINE, without_upcaster))


def test_a_new_argument_ships_in_either_order_without_a_break():
    # The handler first (with a default), then the producer; or the producer first to a handler that takes it.
    handler_first = fleet(paid, on_paid_with_currency)
    assert not breaking(check(BASELINE, handler_first))
    assert not breaking(check(handler_first, fleet(paid_with_currency, on_paid_with_currency)))
    producer_first = fleet(paid_with_currency, on_paid_open)
    assert not breaking(check(fleet(paid, on_paid_open), producer_first))
    assert not breaking(check(producer_first, fleet(paid_with_currency, on_paid_with_currency)))


def test_the_command_exits_1_on_a_break_and_0_otherwise_in_markdown_and_json(tmp_path):
    def documents(name: str, *made: dict[str, Any]) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        for each in made:
            (directory / f"{each['info']['title']}.json").write_text(json.dumps(each))
        return directory

    baseline = documents("baseline", fires(paid), handles(on_paid))
    broken = documents("broken", fires(paid_renamed), handles(on_paid))
    fine = documents("fine", fires(paid), handles(on_paid_with_currency))
    command = [str(Path(sys.executable).parent / "amqp-events"), "contracts", "check"]
    failed = subprocess.run([*command, str(baseline), str(broken)], capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1, failed.stderr
    assert f"| breaking | {EVENT} | billing | shipping/{EVENT} | fired with other arguments |" in failed.stdout
    passed = subprocess.run([*command, str(baseline), str(fine), "--format", "json"], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert passed.returncode == 0, passed.stderr
    [change] = json.loads(passed.stdout)["changes"]
    assert change["breaking"] is False and change["why"] == ["currency added (string, optional)"]


# -- the schema comparison, over spaces of payload schemas ----------------------------------------------------

TYPES = st.sampled_from(["string", "integer", "number", "boolean"])
NAMES = st.sampled_from(["a", "b", "c", "d", "e"])


@st.composite
def payloads(draw: st.DrawFn) -> dict[str, Any]:
    properties = draw(st.dictionaries(NAMES, TYPES.map(lambda kind: {"type": kind}), max_size=5))
    required = draw(st.lists(st.sampled_from(sorted(properties)), unique=True)) if properties else []
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if draw(st.booleans()):
        schema["additionalProperties"] = False
    return schema


def nothing(reference: str) -> dict[str, Any]:
    return {}


@given(payloads())
def test_a_schema_accepts_itself(schema):
    assert accepts(schema, schema, nothing) == []


@given(payloads(), NAMES, TYPES)
def test_a_handler_that_requires_what_is_not_always_sent_refuses(schema, name, kind):
    consumer = {**schema, "properties": {**schema["properties"], name: {"type": kind}}}
    consumer["required"] = sorted({*schema.get("required", ()), name})
    producer = {**schema, "properties": {k: v for k, v in schema["properties"].items() if k != name}}
    producer["required"] = [k for k in schema.get("required", ()) if k != name]
    assert any(why.startswith(f"{name}: required") for why in accepts(consumer, producer, nothing))


@given(payloads(), payloads())
def test_making_a_handler_s_argument_optional_or_its_type_anything_never_makes_it_refuse_more(consumer, producer):
    refused = set(accepts(consumer, producer, nothing))
    looser = {**consumer, "required": [], "properties": {name: {} for name in consumer["properties"]}}
    assert set(accepts(looser, producer, nothing)) <= refused
    opened = {key: value for key, value in consumer.items() if key != "additionalProperties"}
    assert set(accepts(opened, producer, nothing)) <= refused


@given(NAMES)
def test_an_integer_is_taken_where_a_number_is_but_not_the_other_way(name):
    number = {"type": "object", "properties": {name: {"type": "number"}}}
    integer = {"type": "object", "properties": {name: {"type": "integer"}}}
    assert accepts(number, integer, nothing) == []
    assert accepts(integer, number, nothing) == [f"{name}: number where integer is taken"]


# -- messages at rest, judged as a worker judges them --------------------------------------------------------

KEYS = st.sampled_from(["invoice_id", "amount", "total", "currency", "note"])


@given(st.dictionaries(KEYS, st.integers() | st.text(max_size=5), max_size=5), st.sampled_from([None, 1, 2]))
def test_a_message_at_rest_is_refused_exactly_when_the_handler_could_not_be_called_with_it(kwargs, version):
    def v1_to_v2(arguments: dict[str, Any]) -> dict[str, Any]:
        return {**arguments, "total": arguments.pop("amount", "0")}

    app = events_app("shipping", broker_url=URL)
    app.handler(EVENT, upcasters={1: v1_to_v2})(on_paid_total)
    headers = {} if version is None else {"event_version": version}
    [tally] = judge(app.handlers.values(), [AtRest("archive", EVENT, headers, [], kwargs)])
    upcast = v1_to_v2(dict(kwargs)) if version in (None, 1) else kwargs
    try:
        inspect.signature(on_paid_total).bind(**upcast)
        fits = True
    except TypeError:
        fits = False
    assert (tally.sampled, sum(tally.refused.values())) == (1, 0 if fits else 1)
