"""Handler options owned by the feature that reads them, as a dramatiq middleware declares its actor options.

``@app.handler`` takes the options every feature declares (the inbox's ``inbox``/``dedup``, the breakers'
``breaker``/``requires``, ordering's ``ordered_by``/``on_archive``); the handler keeps them by name in
:attr:`Handler.options <amqp_events.core.handler.Handler.options>` for the feature to read. The core knows none of
them: a feature's check says what they make of the handler in the core's own terms (a handle as first argument,
a key, parking).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amqp_events.core.handler import Handler

#: Given the handler (as the features checked before made it) and the feature's options (defaults filled in):
#: raises ``TypeError`` for options that do not fit it, else returns the handler's fields they set.
Check = Callable[["Handler", Mapping[str, Any]], Mapping[str, Any]]


def _fits_any(handler: Handler, options: Mapping[str, Any]) -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True)
class HandlerOptions:
    """The options of ``@app.handler`` one feature owns: their names with defaults, and their check."""

    feature: str
    defaults: Mapping[str, Any]
    check: Check = field(default=_fits_any)

    def apply(self, handler: Handler, given: Mapping[str, Any]) -> Handler:
        """``handler`` with this feature's options (from ``given``, defaults for the others) and their effects."""
        import dataclasses

        options = {name: given.get(name, default) for name, default in self.defaults.items()}
        draft = dataclasses.replace(handler, options={**handler.options, **options})
        return dataclasses.replace(draft, **self.check(draft, options))
