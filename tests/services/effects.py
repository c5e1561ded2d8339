"""The table the payments service writes its effects to (one row per committed effect)."""

from sqlalchemy import Column, Integer, MetaData, String, Table

metadata = MetaData()
effects = Table(
    "effects",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(64)),
    Column("tag", String(64)),
    Column("pid", Integer),
)
