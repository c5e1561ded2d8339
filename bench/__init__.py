"""Benchmarks of celery-amqp-events against its baselines, side by side in one run: ``python -m bench``."""
