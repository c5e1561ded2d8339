"""How deep a header nests and how many bytes the headers take (pure): what the worker measures before anything
reads a header, checked over every shape py-amqp can read a field table into (Hypothesis)."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from amqp_events.wire import bounds

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5), st.binary(max_size=5),
    st.decimals(allow_nan=False, allow_infinity=False), st.datetimes(timezones=st.just(timezone.utc)),
)  # fmt: skip
FIELDS = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=30,
)


def nesting(value: Any) -> int:
    """Depth by its definition: a scalar or an empty table or list is 0, anything else one more than its deepest
    field."""
    children = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
    return 1 + max(map(nesting, children)) if children else 0


@given(FIELDS, st.integers(min_value=-1, max_value=6))
def test_depth_is_the_nesting_counted_up_to_one_past_the_limit(value: Any, limit: int) -> None:
    assert bounds.depth(value, limit) == min(nesting(value), limit + 1)


def test_a_table_of_scalars_is_one_deep_and_an_empty_one_is_flat() -> None:
    attributes = {"id": "e1", "time": datetime.now(timezone.utc), "size": Decimal(1), "n": 1, "none": None}
    assert bounds.depth(attributes) == 1 and bounds.depth({}) == 0 and bounds.depth({"a": {}}) == 1
    deep: Any = 1
    for _ in range(12):
        deep = [deep]
    assert bounds.depth({"deep": deep}, limit=3) == 4


@given(st.dictionaries(st.text(max_size=8), FIELDS, max_size=6), st.integers(min_value=0, max_value=400))
def test_the_quick_bound_of_the_headers_is_never_below_what_is_cut_by(headers: dict[str, Any], limit: int) -> None:
    """:func:`~amqp_events.wire.bounds.at_most` lets :func:`~amqp_events.wire.bounds.cut_headers` skip encoding
    anything: only sound if it never says less than the sizes the cut counts."""
    exact = sum(1 + len(str(key)) + bounds.encoded_size(value) for key, value in headers.items())
    assert bounds.at_most(headers) >= exact
    kept = dict(headers)
    dropped = bounds.cut_headers(kept, limit)
    assert (dropped == []) == (kept == headers)
    assert (
        not dropped
        or sum(1 + len(str(k)) + bounds.encoded_size(v) for k, v in kept.items()) <= limit
        or (set(kept) <= {"task", "id"})
    )
