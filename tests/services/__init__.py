"""Small services the tests run as real Celery workers (``celery -A services.orders worker``)."""
