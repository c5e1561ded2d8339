"""Messages at rest (in a service's archive, on the history stream) judged by today's handlers: would each handler
that would get it refuse it, and why. The judge is the worker's own: the handler's upcasters, then its fit to the
arguments. Pure: the messages and the handlers in, a tally out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from amqp_events.contracts.tables import markdown_table
from amqp_events.core.handler import Handler
from amqp_events.core.versions import as_handled
from amqp_events.errors import BadArguments
from amqp_events.wire.message import EVENT_VERSION


@dataclass(frozen=True)
class AtRest:
    """One message at rest: where, of which event, and its arguments (``None``: its body cannot be read)."""

    where: str
    event: str
    headers: Mapping[str, Any]
    args: Sequence[Any] | None
    kwargs: Mapping[str, Any] | None
    #: The handler it is for (an archived message: the one that archived it; ``""``: each handler of its event).
    task: str = ""


@dataclass
class Tally:
    """What one handler would make of the messages at rest in one place."""

    where: str
    event: str
    handler: str
    sampled: int = 0
    #: Why, with how many messages each.
    refused: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "refused": dict(self.refused)}


def judge(handlers: Iterable[Handler], messages: Iterable[AtRest]) -> list[Tally]:
    """Each handler's tally of the ``messages`` it would get, by place and event."""
    by_event: dict[str, list[Handler]] = {}
    for handler in handlers:
        by_event.setdefault(handler.event, []).append(handler)
    tallies: dict[tuple[str, str, str], Tally] = {}
    for message in messages:
        for handler in by_event.get(message.event, ()):
            if message.task and message.task != handler.task_name:
                continue
            tally = tallies.setdefault(
                (message.where, message.event, handler.task_name),
                Tally(message.where, message.event, handler.task_name),
            )
            tally.sampled += 1
            why = refusal(handler, message)
            if why is not None:
                tally.refused[why] += 1
    return sorted(tallies.values(), key=lambda tally: (tally.where, tally.event, tally.handler))


def refusal(handler: Handler, message: AtRest) -> str | None:
    """Why ``handler`` would refuse ``message`` before running (``None``: it would run it)."""
    if message.args is None or message.kwargs is None:
        return "its body cannot be read"
    try:
        handler.fit(tuple(message.args), as_handled(handler, message.headers.get(EVENT_VERSION) or 1, message.kwargs))
    except BadArguments as exc:
        return str(exc)
    return None


def markdown(tallies: list[Tally]) -> str:
    if not tallies:
        return "No message at rest for any handler of this service.\n"
    rows = (
        [
            tally.where, tally.event, tally.handler, str(tally.sampled), str(sum(tally.refused.values())),
            "; ".join(f"{count}: {reason}" for reason, count in tally.refused.most_common()),
        ]
        for tally in tallies
    )  # fmt: skip
    return markdown_table(["where", "event", "handler", "sampled", "refused", "why"], rows)
