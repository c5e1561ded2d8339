"""Flow control across the fleet: at most N runs of a handler at once, and at most N started per window, counted
over every worker of the service, per handler or per key, held on the broker.

* :mod:`~amqp_events.limits.rates`: ``"50/m"`` and ``"10/s,100000/d"`` read into windows (pure);
* :mod:`~amqp_events.limits.options`: ``@app.handler``'s ``concurrency=``, ``concurrency_key=``, ``rate_limit=``
  and ``rate_limit_key=`` (pure);
* :mod:`~amqp_events.limits.middleware`: takes what a run needs before it starts and gives back what it held after.

Where the counts live is the transport's (:mod:`amqp_events.transport.leases`): a run holds a *lease*, an
exclusive queue of the worker's connection, which the broker deletes when the connection ends (a worker killed
mid-run gives its share back at once); a start is a message in a bounded queue whose messages live one window,
which the broker refuses once the window is full. The queue values are :mod:`amqp_events.topology.limits`.
"""

from amqp_events.limits.rates import Rate, parse_rates

__all__ = ["Rate", "parse_rates"]
