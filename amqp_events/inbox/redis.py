"""Keys of effects done, in Redis (``SET NX`` with a TTL): the weak form for effects outside a database."""

from __future__ import annotations

import inspect
from typing import Any

from amqp_events.coroutines import complete
from amqp_events.inbox.base import EffectKey

#: Default lifetime of a key: as long as the inbox's retention (a duplicate arriving later runs again).
DEFAULT_TTL = 14 * 24 * 3600


class RedisDedup:
    """``@app.handler(..., dedup=RedisDedup(redis.Redis.from_url(url)))``.

    Before the handler runs the key is looked up; after it succeeded the key
    is set with ``SET NX EX ttl``. After ``ttl`` seconds a duplicate runs
    again. Not covered: a worker dying between the effect and the record,
    and two duplicates running at the same moment.
    """

    def __init__(self, client: Any, ttl: int = DEFAULT_TTL, prefix: str = "amqp_events:done:") -> None:
        self.client, self.ttl, self.prefix = client, ttl, prefix

    def seen(self, key: EffectKey) -> bool:
        return bool(_result(self.client.exists(self.prefix + str(key))))

    def record(self, key: EffectKey) -> None:
        _result(self.client.set(self.prefix + str(key), b"1", nx=True, ex=self.ttl))


def _result(reply: Any) -> Any:
    return complete(reply) if inspect.iscoroutine(reply) else reply
