"""Django settings of the test projects: one PostgreSQL database and the library's Django app."""

from urllib.parse import urlsplit

import django
from django.conf import settings


def configure(database_url: str) -> None:
    """Configure and set up Django on ``database_url`` (``postgresql://user@host:port/name``)."""
    url = urlsplit(database_url.replace("+psycopg", ""))
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": url.path.lstrip("/"),
                "USER": url.username,
                "HOST": url.hostname,
                "PORT": url.port,
            }
        },
        INSTALLED_APPS=["amqp_events.django"],
        USE_TZ=True,
    )
    django.setup()
