"""What a fault-injection run fires: its services, its event kinds, and which events are poison."""

SERVICES = ("alpha", "beta", "gamma")
KINDS = ("fault.a", "fault.b", "fault.c")


def poison_of(seq: int) -> str:
    """The poison events: every 97th, alternately failing until out of retries and non-retryable."""
    if seq % 97 != 13:
        return ""
    return "retry" if (seq // 97) % 2 else "permanent"
