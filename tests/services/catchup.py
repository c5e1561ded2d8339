"""The ``catchup`` test service: deployed after events were fired, it catches up from the history.

Its handler's effect (a row of ``effects``, in ``DATABASE_URL``) happens once per event: an inbox in the same
transaction skips an event it got both live and from a replay.
"""

import os

from sqlalchemy import create_engine, insert

from amqp_events import current_event
from amqp_events.celery import events_app
from amqp_events.inbox import Inbox
from services.effects import effects

app = events_app("catchup", broker_url=os.environ["BROKER_URL"])
engine = create_engine(os.environ["DATABASE_URL"])


@app.handler("ledger.entry", inbox=Inbox(engine))
def on_entry(connection, account: str, n: int) -> None:
    connection.execute(insert(effects).values(event_id=current_event().id, tag=f"{account}:{n}", pid=os.getpid()))


@app.handler("ledger.posted", ordered_by="account", inbox=Inbox(engine))
def on_posted(connection, account: str, n: int) -> None:
    """Ordered by account: the effects table's ids give the order each account's events ran in."""
    connection.execute(insert(effects).values(event_id=current_event().id, tag=f"{account}:{n}", pid=os.getpid()))
