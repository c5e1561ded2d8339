"""A service written against 0.1.0's API, unchanged: the app in ``celery.py``, events in ``events.py``, handlers
in ``tasks.py`` (an event's own ``.handler`` decorator, a bound handler calling ``self.retry()``, a ``Task``
subclass), retries configured by the environment (``AMQP_EVENTS_MAX_RETRIES``)."""
