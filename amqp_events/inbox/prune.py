"""Pruning the inboxes (and SQL dedup stores) of a service's handlers: keys older than the retention go."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from amqp_events.inbox.base import effect_stores

logger = logging.getLogger(__name__)


def prunable_stores(handlers: Iterable[Any]) -> list[Any]:
    """The distinct inboxes and dedup stores of ``handlers`` that can be pruned (a ``prune`` method)."""
    stores = {id(store): store for handler in handlers for store in effect_stores(handler) if hasattr(store, "prune")}
    return list(stores.values())


def prune(stores: Iterable[Any], retention: float) -> None:
    """Remove the keys older than ``retention`` seconds from each store; a failure is logged, not raised."""
    for store in stores:
        try:
            pruned = store.prune(time.time() - retention)
        except Exception as exc:
            logger.warning("could not prune an inbox: %s(%s)", type(exc).__name__, str(exc)[:200])
        else:
            if pruned:
                logger.info("pruned %d key(s) older than %gs from an inbox", pruned, retention)
