"""What each archive reason means, in an operator's words (the console explains the names it shows). Pure."""

from __future__ import annotations

from amqp_events.wire.message import Reason

MEANINGS: dict[Reason, str] = {
    Reason.MAX_RETRIES: "its handler failed on every attempt its retry policy allows",
    Reason.NON_RETRYABLE: "its handler raised an error that no retry can mend (PermanentFailure, or one it lists)",
    Reason.WORKER_LOST: "the process running it died (killed, out of memory) more often than it may",
    Reason.UNDECODABLE: "its body or headers could not be read as an event",
    Reason.FORBIDDEN_CONTENT_TYPE: "its content type is not one the service accepts (JSON only)",
    Reason.UNKNOWN_EVENT: "no handler of the service takes this event from the queue it arrived on",
    Reason.BAD_ARGUMENTS: "its arguments do not fit the handler's signature (or give no key an option needs)",
    Reason.POISONOUS: "it failed inside a poisonous() section: a retry cannot succeed",
    Reason.INVALID_CLOUDEVENT: "a CloudEvent without a required attribute, or with a malformed one",
    Reason.MALFORMED_HEADERS: "a header of the wrong type, too long or too deep, or one that contradicts the routing",
    Reason.TOO_LARGE: "its body or headers are larger than a worker takes: archived cut, saying what was cut",
    Reason.EMBEDDED_WORKFLOW: "its body asks Celery to run other tasks, which an event never does",
    Reason.NOT_OWNER: "the service the broker verified as its author does not own the event",
    Reason.EXPIRED: "its expiry passed before it ran (unrun)",
    Reason.DEAD_LETTERED: "the broker dead-lettered it here for another reason than expiry (its word is kept)",
    Reason.DELAY_REFUSED: "the broker refused the copy that was to wait on the delay ladder",
    Reason.REVOKED: "its id was revoked by Celery's remote control (celery control revoke)",
}
