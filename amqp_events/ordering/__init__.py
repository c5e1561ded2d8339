"""Ordered handling per key: one aggregate's events handled one at a time, in the order the broker took them.

How it works (docs/guides/ordering.md):

* **Partitions.** A service's ordered handlers share ``amqp_events_partitions``
  quorum queues, ``<service>.ordered.NN``. A key falls into one of 64 slots
  (the ``event_slot`` header, the CRC-32 of the key); the headers exchange
  ``<service>.ordered`` sends each slot to one partition, so every event of
  one key goes to the same partition, in the order the broker accepted them.
* **One consumer per partition.** Each partition has a single active
  consumer (``x-single-active-consumer``): whatever the number of workers,
  one of them takes a partition's messages, in order. If it dies, RabbitMQ
  gives its unacked messages back first, in their order, to the next one.
  Workers share the partitions out (:mod:`amqp_events.celery.partitions`).
* **Lanes in the worker.** Within the messages a worker holds, those of one
  key run one at a time (:class:`~amqp_events.ordering.lanes.Lanes`); other
  keys run alongside.
* **Retries keep their place.** A failed event's retry does not go through
  the delay ladder: the worker keeps the original, unacked on the broker, and
  runs it again after its delay; later events of its key wait behind it, the
  others go on. The cost is bounded by the prefetch window.
* **Parking** (:mod:`~amqp_events.ordering.parking`). When an event is
  archived, the later events of its key wait in the partition's parked queue
  until it is replayed or discarded, then go back to the partition in order.
"""
