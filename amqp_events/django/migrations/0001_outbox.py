"""The outbox tables, created with the same SQL as ``amqp-events outbox init`` (from one definition)."""

from django.db import migrations

from amqp_events.django import django_tables
from amqp_events.outbox.targets import dialect_of


def create_outbox(apps, schema_editor):
    for statement in django_tables().create_statements(dialect_of(schema_editor.connection)):
        schema_editor.execute(statement)


def drop_outbox(apps, schema_editor):
    quote = schema_editor.quote_name
    for table in reversed(django_tables().tables):
        schema_editor.execute(f"DROP TABLE IF EXISTS {quote(table.name)}")


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [migrations.RunPython(create_outbox, drop_outbox)]
