"""The inbox table, created with the same SQL as ``amqp-events inbox init`` (from one definition)."""

from django.db import migrations

from amqp_events.database import create_statements
from amqp_events.django import inbox_table_name
from amqp_events.inbox.sql import inbox_table
from amqp_events.outbox.targets import dialect_of


def create_inbox(apps, schema_editor):
    for statement in create_statements([inbox_table(inbox_table_name())], dialect_of(schema_editor.connection)):
        schema_editor.execute(statement)


def drop_inbox(apps, schema_editor):
    schema_editor.execute(f"DROP TABLE IF EXISTS {schema_editor.quote_name(inbox_table_name())}")


class Migration(migrations.Migration):
    dependencies = [("amqp_events", "0001_outbox")]
    operations = [migrations.RunPython(create_inbox, drop_inbox)]
