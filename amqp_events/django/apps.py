from django.apps import AppConfig


class AmqpEventsConfig(AppConfig):  # type: ignore[misc]  # Django is untyped
    name = "amqp_events.django"
    label = "amqp_events"
    verbose_name = "celery-amqp-events"
