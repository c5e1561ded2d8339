"""Property-based fuzzing of what a worker takes (Hypothesis over whole message spaces, a real broker and worker).

Each example is one AMQP message that another service (``shipping``, under its own user with the grants `topology
permissions` prints, ownership on) fires as ``test.ping``, its own event, which ``orders`` handles under its own
user: headers of every AMQP type and depth (Celery's, the library's, RabbitMQ's, the archive's and anything else;
counts negative and past what AMQP carries; names that are not UTF-8; far too large), bodies (events with every
shape of Celery's embed, other JSON, random bytes, compressed or claiming to be, larger than the worker takes),
content types and encodings, an AMQP expiration, and a ``user_id`` as any party could set it. For each, against a
real worker of each pool (the default one too):

* the message ends handled or archived within a bound (retries included), never dropped: the test counts both;
* the worker is still serving after it;
* at the end every case is accounted for by its own marker, and no queue holds a dead-lettered message;
* then orders' operator replays the whole archive, and once every replay has ended again, no run of any kind ran
  a handler other than ``test.ping``'s (the event the broker routed), nor as another author than ``shipping``.

``FUZZ_EXAMPLES`` sets the examples per pool (CI runs the default; ``FUZZ_EXAMPLES=2000`` is a long run).
"""

from __future__ import annotations

import bz2
import json
import lzma
import os
import sys
import zlib
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from helpers import TESTS, Records
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from kombu import Connection
from trust_helpers import users_of

from amqp_events.testing import wait_for
from amqp_events.wire.message import is_task_body

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
QUEUE = "orders:test.ping"
#: The sender owns ``test.ping``; orders owns its other events.
OWNERS = "test.ping=shipping,test.#=orders,billing.#=shipping,users.#=orders"
#: Each case carries its number here, to be found afterwards among the archived and the handled.
MARKER = "fuzz_case"
#: Seconds a case may take to end (an early eta waits up to 3 s, a retry 1 s, archiving is confirmed first).
BOUND = 30.0
#: Bytes of a body the fuzzed worker takes (``amqp_events_max_body_bytes``): some cases go past it.
MAX_BODY = 64 * 1024

NOW = datetime.now(timezone.utc)

# -- header values: every type py-amqp writes, nested, and far too deep --------------------------------------

text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),  # RabbitMQ closes the connection on an infinite float
    text,
    st.binary(max_size=40),
    st.decimals(min_value=-(10**6), max_value=10**6, places=2, allow_nan=False, allow_infinity=False),
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1)).map(
        lambda moment: moment.replace(microsecond=0)
    ),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4))


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = {"n": value} if level % 2 else [value]
    return value


deep = st.integers(min_value=10, max_value=2500).map(nested)
#: Counts as a sender could write them: fine, negative, past what AMQP's integers or a copy's +1 can carry.
counts = st.one_of(
    st.integers(min_value=0, max_value=3),
    st.integers(min_value=-(2**63), max_value=-1),
    st.sampled_from([2**31 - 2, 2**31 - 1, 2**31, 2**62, 2**63 - 1]),
)
signature = {
    "task": "test.orders_only",
    "args": ["chained"],
    "kwargs": {},
    "options": {"queue": "orders:test.orders_only"},
}
#: Every shape of Celery's embed: empty ones, and each way of asking Celery to run other tasks.
embeds = st.sampled_from([
    None, {}, {"callbacks": None}, {"chain": []}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    {"chain": [signature]}, {"callbacks": [signature]}, {"errbacks": [signature]}, {"chord": signature},
    {"chain": "not a list"}, {"callbacks": [signature], "chain": [signature, signature]},
])  # fmt: skip
times = st.sampled_from(
    [(NOW - timedelta(hours=1)).isoformat(), (NOW + timedelta(seconds=2)).isoformat(), "soon", "2020-02-30"]
)
#: The headers Celery, the library and RabbitMQ read, each with values of the right and of every wrong type.
KNOWN = {
    "task": st.one_of(st.just("test.ping"), values, text),
    "id": st.one_of(st.uuids().map(str), values, st.text(min_size=256, max_size=300)),
    "retries": st.one_of(counts, values),
    "group_index": st.one_of(counts, values),
    "replaced_task_nesting": st.one_of(counts, values),
    "replay_batch": st.one_of(counts, values),
    "timelimit": st.one_of(st.just([None, None]), st.just([1, 2]), st.tuples(counts, counts).map(list), values),
    "eta": st.one_of(st.none(), times, values),
    "expires": st.one_of(st.none(), times, values),
    "stamped_headers": st.one_of(st.just(["a"]), values),
    "stamps": values,
    "root_id": values,
    "parent_id": values,
    "group": values,
    "lang": values,
    "shadow": values,
    "argsrepr": values,
    "kwargsrepr": values,
    "ignore_result": values,
    "lost_runs": st.one_of(counts, values),
    "section_retries": st.one_of(st.dictionaries(text, counts, max_size=2), values),
    "failed_section": values,
    "event_key": values,
    "fired_at": st.one_of(times, values),
    "x-death": st.one_of(values, counts.map(lambda n: [{"queue": QUEUE, "reason": "rejected", "count": n}])),
    "x-delivery-count": st.one_of(counts, values),
    "ce-id": values,
    "ce-type": values,
    "ce-specversion": st.one_of(st.just("1.0"), values),
    "traceparent": values,
    # Names a handler of the service (another event's too), one it does not have, or anything.
    "for_handler": st.one_of(st.sampled_from(["test.ping", "test.orders_only", "test.ping:nobody"]), values),
    # Claims an author: the service itself, another, none.
    "fired_by": st.one_of(st.sampled_from(["orders", "billing", ""]), values),
    # Headers only the service's own copies carry: commands to its partitions, replay batches, a cut note.
    "release_parked": values,
    "hold_live": values,
    "replay_of": values,
    "archive_cut": values,
    "fired_as": st.one_of(st.just("test.orders_only"), values),
    # What the archive and RabbitMQ's dead-lettering write: naming orders' other handler, its queue, a reason.
    "archive_task": st.one_of(st.just("test.orders_only"), values),
    "archive_queue": st.one_of(st.just("orders:test.orders_only"), values),
    "archive_reason": st.one_of(st.just("max_retries"), values),
    "x-first-death-queue": st.one_of(st.sampled_from(["orders:test.orders_only", QUEUE]), values),
    "x-first-death-reason": st.one_of(st.sampled_from(["expired", "rejected"]), values),
}
OTHERS = {
    "compression": st.sampled_from(["application/x-gzip", "application/x-bz2", "application/x-lzma", "zstd"]),
    "deep": deep,
    "other": values,
    # Far larger than a copy of the message can carry with its own headers (frame_max is 128 KiB).
    "big": st.integers(min_value=60_000, max_value=100_000).map(lambda size: "b" * size),
}
#: Header names that are not UTF-8 (py-amqp hands them over as bytes).
NOT_UTF8 = st.binary(min_size=1, max_size=12).filter(lambda raw: not _utf8(raw))


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


#: What a producer would send, before anything is changed.
VALID = {"task": "test.ping", "lang": "py", "retries": 0}


@st.composite
def header_sets(draw: Any) -> dict[str, Any]:
    """A valid event's headers (a fresh id), then a few of them changed, dropped or added: every header of every
    type is reachable, and most messages still differ from a good one in one or two places only."""
    headers: dict[str, Any] = {**VALID, "id": draw(st.uuids()).hex}
    for name in draw(st.lists(st.sampled_from(sorted(KNOWN)), max_size=3, unique=True)):
        headers[name] = draw(KNOWN[name])
    for name in draw(st.lists(st.sampled_from(sorted(OTHERS)), max_size=2, unique=True)):
        headers[name] = draw(OTHERS[name])
    for name in draw(st.lists(st.sampled_from(["task", "id", "retries"]), max_size=1)):
        headers.pop(name, None)
    if draw(st.integers(0, 9)) == 0:
        headers[draw(NOT_UTF8)] = draw(values)  # type: ignore[index]
    return headers


# -- bodies ------------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
)
how = st.sampled_from([None, {"fail_times": 1}, {"permanent": True}])
event_bodies = st.tuples(how, embeds).map(lambda parts: ("event", parts[0], parts[1]))
#: Larger than the fuzzed worker takes (``MAX_BODY``).
oversized = st.integers(min_value=MAX_BODY + 1, max_value=3 * MAX_BODY).map(
    lambda size: ("bytes", b'[["' + b"o" * size + b'"], {}, null]')
)
bodies = st.one_of(
    event_bodies,
    event_bodies,
    # Any JSON but an event's body (whose tag would not be its case's marker: events are the cases above).
    json_values.filter(lambda value: not is_task_body(value)).map(lambda value: ("json", json.dumps(value).encode())),
    st.binary(max_size=200).map(lambda raw: ("bytes", raw)),
    oversized,
)
#: The ``user_id`` property as each party could set it: none, the sender's own, or another's (the broker refuses).
user_ids = st.sampled_from(["none", "own", "own", "orders", "guest"])
#: The AMQP expiration: mostly none; one that may pass before the worker takes it (the broker archives it).
expirations = st.sampled_from([None, None, None, None, "0", "5"])
content_types = st.one_of(
    st.just("application/json"),
    st.sampled_from(["application/json; charset=utf-8", "application/x-python-serialize", "application/x-yaml",
                     "text/plain", None, "application/json; charset=latin-1"]),
)  # fmt: skip
encodings = st.one_of(st.just("utf-8"), st.sampled_from(["binary", "latin-1", None, "no-such-codec"]))
COMPRESS = {"application/x-gzip": zlib.compress, "application/x-bz2": bz2.compress, "application/x-lzma": lzma.compress}


def body_of(case: int, body: tuple[Any, ...], headers: dict[str, Any]) -> bytes:
    """The bytes of ``body``: an event's carry the case's tag, compressed when its headers say so."""
    raw = json.dumps([[f"fuzz-{case}", body[1]], {}, body[2]]).encode() if body[0] == "event" else body[1]
    compress = COMPRESS.get(headers.get("compression"))  # type: ignore[arg-type]
    return compress(raw) if compress else raw


class Cases:
    """What the fuzzing sent (as the user of ``sender``), and how many of it have ended (handled for good, or
    archived: counted as ``admin``, who may read orders' archive)."""

    def __init__(self, sender: str, admin: str, records: Records) -> None:
        self.sender, self.records = sender, records
        self.sent: dict[int, tuple[Any, ...]] = {}
        #: The case of each event id sent (a run of a body the fuzz did not tag, a CloudEvent's, is found by it).
        self.by_id: dict[str, int] = {}
        #: Messages the broker refused to take (an invalid header frame, another's user_id): never at a worker.
        self.refused = 0
        # One connection for every send and count (a connection per poll churned RabbitMQ 4.0 into connect timeouts).
        self.connection = Connection(sender, transport_options={"confirm_publish": True})
        self.admin = Connection(admin)

    def send(
        self,
        headers: dict[str, Any],
        body: tuple[Any, ...],
        content_type: Any,
        encoding: Any,
        user_id: str,
        expiration: str | None,
    ) -> int:
        case = max(self.sent, default=0) + 1
        headers = {**headers, MARKER: case}
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))  # py-amqp writes deep headers recursively
        channel = self.connection.default_channel
        properties = {"own": {"user_id": self.connection.userid}, "none": {}}.get(user_id, {"user_id": user_id})
        message = channel.prepare_message(
            body_of(case, body, headers),
            content_type=content_type,
            content_encoding=encoding,
            headers=headers,
            properties={**properties, **({"expiration": expiration} if expiration else {})},
        )
        try:
            channel.basic_publish(message, exchange="events", routing_key="test.ping", confirm_timeout=BOUND)
        except self.connection.connection_errors + self.connection.channel_errors:
            self.refused += 1  # the broker refused it (a header frame over frame_max, a user_id not the sender's)
            self.connection.close()
            self.connection = Connection(self.sender, transport_options={"confirm_publish": True})
            return 0
        self.sent[case] = body
        for name in ("id", "ce-id"):
            self.by_id.setdefault(str(headers.get(name)), case)
        return case

    def close(self) -> None:
        self.connection.close()
        self.admin.close()

    def handled(self) -> set[int]:
        """Cases whose handler returned: it ran without being told to fail, or told to fail once, ran again."""
        done = set()
        for run in self.records.all():
            tag = str(run["tag"])
            case = int(tag[5:]) if tag.startswith("fuzz-") and tag[5:].isdigit() else self.by_id.get(str(run["id"]))
            if case is None:
                continue  # not a case: the assertion on every case's end reports what is missing
            told = _told(self.sent[case])
            if told is not None and not told.get("permanent") and run["attempt"] > told.get("fail_times", 0):
                done.add(case)
        return done

    def archived(self) -> int:
        return int(self.admin.default_channel.queue_declare("orders.archive", passive=True).message_count)

    def ended(self) -> int:
        return len(self.handled()) + self.archived()


def _told(body: tuple[Any, ...]) -> dict[str, Any] | None:
    """What a case's handler was told to do (``None``: something it fails on): an event's ``how``; for a body of
    another shape that ran (a CloudEvent's JSON data, the handler's keyword arguments), its ``how``."""
    if body[0] == "event":
        how = body[1]
    else:
        data = json.loads(body[1]) if body[0] == "json" else None
        how = data.get("how") if isinstance(data, dict) else None
    return (how or {}) if isinstance(how, dict) or not how else None


def fuzz(fleet: Any, start_worker: Any, cli_process: Any, broker_url: str, records: Records, archive_of: Any,
         rabbitmq: Any, vhost: str, **pool: Any) -> None:  # fmt: skip
    urls, env = fleet
    env = {**env, "AMQP_EVENTS_SHARED_TOPOLOGY": "check", "BROKER_URL": urls["orders"]}
    worker_env = {"RECORD_FILE": str(records.path), "PYTHONPATH": str(TESTS), **env,
                  "MAX_RETRIES": "1", "BACKOFF_MAX": "1", "MAX_BODY_BYTES": str(MAX_BODY)}  # fmt: skip
    process = start_worker("services.orders", env=worker_env, cwd=TESTS, **pool)
    cases = Cases(urls["shipping"], broker_url, records)

    @settings(
        max_examples=EXAMPLES,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
        # Each example costs a real round through the worker: report what failed rather than shrink it for minutes.
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
    )
    @given(header_sets(), bodies, content_types, encodings, user_ids, expirations)
    def one_message_ends_handled_or_archived(headers, body, content_type, encoding, user_id, expiration):
        before = cases.ended()
        case = cases.send(headers, body, content_type, encoding, user_id, expiration)
        assume(case)
        try:
            wait_for(lambda: cases.ended() > before or None, BOUND, what=f"case {case} to end")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the worker's log ends with:\n{process.log()[-4000:]}") from None
        assert process.is_running(), process.log()[-3000:]

    try:
        one_message_ends_handled_or_archived()
        # Every case by its own marker: archived with its headers, or handled; and no dead letter left behind.
        wait_for(lambda: cases.ended() >= len(cases.sent) or None, BOUND, what="every case to end")
        entries = archive_of("orders").list()
        archived = {entry.headers.get(MARKER) for entry in entries}
        reasons = Counter(entry.reason for entry in entries)
        report(f"fuzz {pool}: {len(cases.sent)} messages, {cases.refused} refused by the broker, "
               f"{len(cases.handled())} handled, archived {dict(reasons.most_common())}")  # fmt: skip
        assert (archived | cases.handled()) >= set(cases.sent), set(cases.sent) - archived - cases.handled()
        assert not archived & cases.handled(), "a case both handled and archived"

        # Orders' operator replays everything: each replay ends again, handled or archived.
        replayed = cli_process("archive", "replay", "--yes", env=env)
        assert replayed.returncode == 0, replayed.stderr
        wait_for(lambda: cases.ended() >= len(cases.sent) or None, BOUND * 2, what="every replay to end")
        runs = Counter(run["event"] for run in records.all())
        report(f"fuzz {pool}: replayed {replayed.stdout.strip().splitlines()[-1:]}; then {len(cases.handled())} "
               f"handled, {cases.archived()} archived; runs by event {dict(runs)}")  # fmt: skip
    finally:
        cases.close()
    # Nothing a sender wrote chose another handler, or an author: not on arrival, not in a replay.
    assert {run["event"] for run in records.all()} <= {"test.ping"}
    assert {run["fired_by"] for run in records.all()} <= {"shipping"}
    wait_for(lambda: not stranded(rabbitmq, vhost) or None, 15, what="no dead letter held (the API's counts lag)")
    assert process.is_running()


def report(line: str) -> None:
    """Print ``line`` (with ``-s``), and append it to ``$FUZZ_REPORT`` when set (test processes of pytest-xdist
    print nowhere)."""
    print(line)
    if os.environ.get("FUZZ_REPORT"):
        with open(os.environ["FUZZ_REPORT"], "a") as out:
            out.write(line + "\n")


def stranded(rabbitmq: Any, vhost: str) -> dict[str, int]:
    """Queues holding dead letters they could not deliver."""
    return {q["name"]: q.get("messages_dlx", 0) for q in rabbitmq.management.queues(vhost) if q.get("messages_dlx")}


@pytest.fixture
def fleet(rabbitmq, broker_url, cli_process) -> Any:
    """``orders`` and ``shipping`` under users of their own, ownership on."""
    env = {"AMQP_EVENTS_EVENT_OWNERSHIP": "1", "AMQP_EVENTS_EVENT_OWNERS": OWNERS}
    with users_of(rabbitmq, broker_url, cli_process, ("orders", "shipping"), env) as found:
        yield found


@pytest.mark.parametrize(
    "pool",
    [{"pool": None, "concurrency": 2}, {"pool": "solo"}, {"pool": "threads", "concurrency": 4},
     {"pool": "prefork", "concurrency": 2}],
    ids=["default", "solo", "threads", "prefork"],  # the default first: the one run on the other RabbitMQ line
)  # fmt: skip
def test_any_message_ends_handled_or_archived_and_the_worker_keeps_serving(
    pool, fleet, start_worker, cli_process, broker_url, records, archive_of, rabbitmq, vhost
):
    fuzz(fleet, start_worker, cli_process, broker_url, records, archive_of, rabbitmq, vhost, **pool)
