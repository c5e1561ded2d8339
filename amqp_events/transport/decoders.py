"""Bounds on what kombu and py-amqp read of a message before the router sees it, installed once per worker process.

Checked with kombu 5.5.4, 5.6.2 and 5.7.0 (tests/broker/test_hostile_input.py).
"""

from __future__ import annotations

import sys

from kombu import compression

from amqp_events.wire import bounds


def bound_decoders(max_body: int = bounds.MAX_BODY) -> None:
    """Bound what a worker reads before the router sees a message: kombu's decompression (a zlib bomb stops at
    ``max_body``; compressions without a bound are not read) and, on Python 3.11+, whose calls between Python
    functions take no C stack, the recursion py-amqp needs to read the deepest headers a frame can hold (they are
    then refused as malformed, instead of stopping the consumer). Once per worker process."""
    bounded = bounds.bounded_decoders(max_body)
    # Upstream (kombu 5.5-5.7): decoders are kept by content type in this table; register() replaces both ways.
    for content_type in list(compression._decoders):
        decoder = bounded.get(content_type) or bounds.unsupported(content_type)
        compression._decoders[content_type] = decoder
    if sys.version_info >= (3, 11):
        sys.setrecursionlimit(max(sys.getrecursionlimit(), bounds.DECODING_RECURSION))
