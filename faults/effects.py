"""Inbox mode: the table the fault-suite handlers write their effects to, one row per committed effect."""

from sqlalchemy import Column, Integer, MetaData, String, Table

metadata = MetaData()
effects = Table(
    "effects",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("service", String(20)),
    Column("seq", Integer),
    Column("event_id", String(64)),
)
