"""Whether, and after how long, a failed handler runs again. Pure decisions, no I/O."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from amqp_events.errors import PermanentFailure
from amqp_events.settings import Settings
from amqp_events.topology.delays import MAX_DELAY, whole_seconds
from amqp_events.wire.message import Reason


@dataclass(frozen=True)
class RetryLater:
    """Run the handler again after ``delay`` whole seconds."""

    delay: int


@dataclass(frozen=True)
class GiveUp:
    """Archive the message with ``reason``."""

    reason: Reason


Decision = RetryLater | GiveUp


@dataclass(frozen=True)
class RetryPolicy:
    """A handler's retry rules: exponential backoff up to ``max_retries`` retries."""

    max_retries: int
    backoff_base: float = 1.0
    backoff_max: float = 3600.0
    jitter: bool = False
    #: Exception types that archive the message at once.
    dont_retry: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, not {self.max_retries}")
        if self.backoff_base <= 0 or self.backoff_max > MAX_DELAY:
            raise ValueError(
                f"need 0 < backoff_base and backoff_max <= {MAX_DELAY} s (the delay ladder's longest wait), "
                f"got {self.backoff_base} and {self.backoff_max}"
            )

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        max_retries: int | None = None,
        backoff_base: float | None = None,
        backoff_max: float | None = None,
        jitter: bool | None = None,
        dont_retry: tuple[type[BaseException], ...] = (),
    ) -> RetryPolicy:
        """The app-wide policy with a handler's own overrides (``None`` keeps the app's)."""
        return cls(
            max_retries=settings.max_retries if max_retries is None else max_retries,
            backoff_base=settings.backoff_base if backoff_base is None else backoff_base,
            backoff_max=settings.backoff_max if backoff_max is None else backoff_max,
            jitter=settings.backoff_jitter if jitter is None else jitter,
            dont_retry=tuple(dont_retry),
        )

    def backoff(self, retries: int, rng: Callable[[], float] = random.random) -> int:
        """Seconds to wait before retry number ``retries + 1``: ``base * 2**retries``, capped.

        With jitter, a random point between half the delay and all of it, so
        that a burst of failures does not come back all at once.
        """
        delay = min(self.backoff_max, self.backoff_base * 2 ** min(retries, 64))
        if self.jitter:
            delay = delay / 2 + rng() * delay / 2
        return max(1, whole_seconds(delay))

    def decide(
        self,
        exc: BaseException,
        retries: int,
        countdown: float | None = None,
        max_retries: int | None = None,
        rng: Callable[[], float] = random.random,
    ) -> Decision:
        """What to do after attempt ``retries + 1`` raised ``exc``.

        ``countdown`` and ``max_retries`` are a ``self.retry(...)`` call's own
        values; they apply to this decision only and are never stored.
        """
        if isinstance(exc, (PermanentFailure, *self.dont_retry)):
            return GiveUp(Reason.NON_RETRYABLE)
        limit = self.max_retries if max_retries is None else max_retries
        if retries >= limit:
            return GiveUp(Reason.MAX_RETRIES)
        if countdown is not None:
            return RetryLater(whole_seconds(countdown))
        return RetryLater(self.backoff(retries, rng))
