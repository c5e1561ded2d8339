"""An event's arguments travel by name and are checked before publishing (in-process: the same wire path as on the
broker, without one; the broker's own test of the order is in test_contract.py's scenarios)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_events import EventsApp, events_app
from amqp_events.core.arguments import Arguments
from amqp_events.testing.in_process import in_process

URL = "amqp://in-process.invalid//"


@pytest.fixture
def apps() -> Iterator[Callable[[str], EventsApp]]:
    """``apps("shop")``: an app of that service, closed when the test ends."""
    made: list[EventsApp] = []

    def make(service: str) -> EventsApp:
        made.append(events_app(service, broker_url=URL))
        return made[-1]

    yield make
    for app in made:
        app.close()


@pytest.fixture
def shop(apps) -> EventsApp:
    return apps("shop")


@pytest.fixture
def billing(apps) -> EventsApp:
    return apps("billing")


def test_a_handler_that_lists_the_parameters_in_another_order_gets_each_by_its_name(shop, billing):
    received = []

    @shop.event("shop.order.placed")
    def order_placed(order_id: int, customer: str, total: str) -> None:
        pass

    @billing.handler("shop.order.placed")
    def on_placed(order_id: int, total: str, customer: str) -> None:
        received.append({"order_id": order_id, "total": total, "customer": customer})

    with in_process(shop, billing):
        order_placed(1, "ada", "10.00")
    assert received == [{"order_id": 1, "total": "10.00", "customer": "ada"}]


def test_positions_from_a_producer_of_0_1_0_are_still_read(shop, billing):
    received = []

    @billing.handler("shop.order.placed")
    def on_placed(order_id: int, customer: str) -> None:
        received.append((order_id, customer))

    with in_process(shop, billing):
        shop.fire("shop.order.placed", [1, "ada"])  # what 0.1.0's events sent
    assert received == [(1, "ada")]


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (("abc", "5.00"), "invoice_id='abc' is not an int"),
        ((42, 5), "amount=5 is not a str"),
        ((True, "5.00"), "invoice_id=True is not an int"),
        ((42, "5.00", {"a": object()}), "extra=.* cannot travel as JSON"),
        ((42, "5.00", {"a": 1}, "high"), "rate='high' is not a float"),
    ],
)
def test_a_value_that_contradicts_its_annotation_or_is_not_json_is_refused_before_publishing(
    shop, billing, args, refusal
):
    received = []

    @shop.event("billing.invoice.paid")
    def invoice_paid(invoice_id: int, amount: str, extra: dict | None = None, rate: float = 1.0) -> None:
        pass

    @billing.handler("billing.invoice.paid")
    def on_paid(**kwargs) -> None:
        received.append(kwargs)

    with in_process(shop, billing) as events:
        with pytest.raises(TypeError, match=refusal):
            invoice_paid(*args)
        invoice_paid(42, "5.00", {"a": [1]}, 2)  # an int is a float
        assert len(events.fired) == 1
    assert received == [{"invoice_id": 42, "amount": "5.00", "extra": {"a": [1]}, "rate": 2}]


def test_annotations_kept_as_strings_and_other_types_are_read_as_written(shop):
    namespace: dict = {}
    exec(  # the annotations of a module with `from __future__ import annotations` are strings
        "from __future__ import annotations\n"
        "def paid(invoice_id: int, when: datetime | None = None, *lines: str, **more: int): pass\n",
        {"datetime": datetime},
        namespace,
    )
    paid = shop.event("billing.invoice.paid")(namespace["paid"])
    with in_process(shop, unhandled="ignore") as events:
        with pytest.raises(TypeError, match="invoice_id='1' is not an int"):
            paid("1")
        paid(1, datetime(2026, 1, 1), "a", "b", note=3)  # not a plain type: not checked; *lines: by position
    [fired] = events.fired
    assert fired.args == (1, datetime(2026, 1, 1), "a", "b") and fired.kwargs == {"note": 3}


# --- the precompiled path agrees with inspect's bind, for any signature and any call -------------------------

KINDS = [
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.VAR_POSITIONAL,
    inspect.Parameter.KEYWORD_ONLY,
    inspect.Parameter.VAR_KEYWORD,
]
NAMES = ["a", "b", "c", "d", "e"]


@st.composite
def signatures(draw: st.DrawFn) -> inspect.Signature:
    """Valid signatures of up to five parameters: kinds in Python's order, defaults only after the first one."""
    kinds = sorted(draw(st.lists(st.sampled_from(KINDS), max_size=5)), key=KINDS.index)
    # At most one *args and one **kwargs.
    kinds = [k for i, k in enumerate(kinds) if k not in (KINDS[2], KINDS[4]) or k not in kinds[:i]]
    parameters, defaulted = [], False
    for name, kind in zip(NAMES, kinds, strict=False):
        default = inspect.Parameter.empty
        if kind in (KINDS[0], KINDS[1]):
            defaulted = defaulted or draw(st.booleans())
            default = 0 if defaulted else default
        elif kind is KINDS[3] and draw(st.booleans()):
            default = 0
        parameters.append(inspect.Parameter(name, kind, default=default))
    return inspect.Signature(parameters)


def bound(arguments: Arguments, args: tuple, kwargs: dict) -> dict | str | None:
    """What ``inspect.Signature.bind`` makes of a call, by name (the reference, as it was before the plan), or
    "refused"."""
    try:
        return arguments._bound(args, kwargs)
    except TypeError:
        return "refused"


@settings(max_examples=400)
@given(
    signatures(),
    st.lists(st.integers(), max_size=6).map(tuple),
    st.dictionaries(st.sampled_from([*NAMES, "x", "y"]), st.integers(), max_size=5),
)
def test_arguments_by_name_agree_with_bind(signature: inspect.Signature, args: tuple, kwargs: dict) -> None:
    arguments = Arguments(signature)
    expected = bound(arguments, args, kwargs)
    if expected == "refused":
        with pytest.raises(TypeError):
            arguments.by_name(args, kwargs)
    else:
        named = arguments.by_name(args, kwargs)
        assert named == expected
        assert named is None or list(named) == list(expected), "in the order bind gives (the body's bytes)"
