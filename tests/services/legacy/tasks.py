from celery.app.task import Task

from services.behaviour import record
from services.legacy import events
from services.legacy.celery import app


@events.thing_happened.handler(bind=True)
def on_thing_happened(self: Task, value: str, countdown: int | None = None) -> None:
    record("legacy_consumer", tag=value)
    if value == "retry":
        self.retry(countdown=countdown)
    if value == "fail":
        raise ValueError(value)


@app.handler(events.number_is_even.name)
class NumberEvenHandler(Task):
    def run(self, number: int) -> None:
        record("legacy_consumer", tag=f"even-{number}")
