"""Fault injection: workers killed, the broker crashed, bad input, under load; nothing may be lost.

Run it with ``python -m faults --events 10000`` (the full run in RELIABILITY.md);
``tests/broker/test_faults.py`` runs it with 1,500 events in CI.
"""
