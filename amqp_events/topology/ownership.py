"""Which service owns an event: the one service that may fire it, when ownership is on
(``amqp_events_event_ownership``).

An event belongs to the service its first word names (``billing`` owns ``billing.invoice.paid``), unless the
fleet's table ``amqp_events_event_owners`` gives it to another (``{"user.#": "accounts"}``: topic patterns, the
first that matches wins). Every service reads the same table: a producer checks what it fires, a receiver
checks the author the broker verified, and ``topology permissions`` prints topic permissions from it.

Pure: no I/O.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

from amqp_events.settings import Settings


def topic_matches(pattern: str, name: str) -> bool:
    """Does ``name`` match ``pattern`` as a topic binding would (``*`` one word, ``#`` zero or more)?"""
    return _words_match(tuple(pattern.split(".")), tuple(name.split(".")))


@functools.lru_cache(maxsize=4096)
def _words_match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pattern:
        return not words
    first, rest = pattern[0], pattern[1:]
    if first == "#":
        return any(_words_match(rest, words[skip:]) for skip in range(len(words) + 1))
    return bool(words) and first in ("*", words[0]) and _words_match(rest, words[1:])


def owner_of_event(event: str, owners: Mapping[str, str]) -> str:
    """The service that owns ``event``: the first pattern of ``owners`` that matches it, else its first word."""
    for pattern, service in owners.items():
        if topic_matches(pattern, event):
            return service
    return event.split(".", 1)[0]


def owns(settings: Settings, service: str, event: str) -> bool:
    """May ``service`` fire ``event`` (always, with ownership off)?"""
    return not settings.event_ownership or owner_of_event(event, settings.event_owners) == service


def topic_regex(pattern: str) -> str:
    """A topic pattern as a regular expression over routing keys (what RabbitMQ's topic permissions take): each
    word is followed by a dot or the end of the key, so that ``#`` may stand for no word at all."""
    parts = []
    for word in pattern.split("."):
        if word == "#":
            parts.append(r"([^.]+(\.|$))*")
        else:
            parts.append(("[^.]+" if word == "*" else re.escape(word)) + r"(\.|$)")
    return "".join(parts)


def owned_regex(service: str, owners: Mapping[str, str]) -> str:
    """The events ``service`` owns as one regular expression (no anchors), exactly as :func:`owner_of_event`
    decides: each pattern it is given, unless an earlier pattern gives the event to another; and the events its
    name begins, unless any pattern gives them to another."""
    mine: list[str] = []
    before: list[str] = []
    for pattern, owner in owners.items():
        if owner == service:
            mine.append(_unless(before, topic_regex(pattern)))
        else:
            before.append(topic_regex(pattern))
    mine.append(_unless(before, topic_regex(f"{service}.#")))
    return "|".join(mine)


def _unless(others: list[str], regex: str) -> str:
    """``regex``, except where one of ``others`` matches the whole key (a negative lookahead, which RabbitMQ's
    regular expressions, Erlang's PCRE, read)."""
    if not others:
        return f"({regex})"
    return f"(?!({'|'.join(others)})$)({regex})"
