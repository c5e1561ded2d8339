import os

from amqp_events.celery import events_app

app = events_app("loaded", broker_url=os.environ["BROKER_URL"], include=["services.loading.included_handlers"])
