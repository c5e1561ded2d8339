import os

from amqp_events.celery import events_app

app = events_app("legacy_consumer", broker_url=os.environ["BROKER_URL"], imports=["services.legacy.tasks"])
