"""A raw py-amqp consumer of the same queue, with the same prefetch: decode the JSON body, mark, ack each
message. The ceiling of a Python consumer process on this machine (``python raw_consumer.py``)."""

import contextlib
import json
import os
import signal

import amqp
from kombu.utils.url import url_to_parts
from marks import mark


def main() -> None:
    _, host, port, user, password, vhost, _ = url_to_parts(os.environ["BROKER_URL"])
    connection = amqp.Connection(f"{host}:{port}", userid=user, password=password, virtual_host=vhost or "/")
    connection.connect()
    channel = connection.channel()
    channel.basic_qos(0, int(os.environ["PREFETCH"]), False)

    def on_message(message: amqp.Message) -> None:
        _, kwargs, _ = json.loads(message.body)
        mark(kwargs["n"], kwargs["last"])
        channel.basic_ack(message.delivery_tag)

    channel.basic_consume(os.environ["QUEUE"], callback=on_message)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    print("raw consumer ready.", flush=True)  # as a Celery worker says it, for the harness
    while not stopping:
        with contextlib.suppress(TimeoutError):
            connection.drain_events(timeout=1)
    connection.close()


if __name__ == "__main__":
    main()
