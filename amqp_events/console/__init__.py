"""The operator console (``amqp-events console``, the ``console`` extra): every service of a vhost in a browser,
their archives with tracebacks, replay, purge, pause and resume, through a JSON API scripts can use too.

* :mod:`~amqp_events.console.discovery`: the services found by the library's queue names (pure)
* :mod:`~amqp_events.console.security`: who may look, who may change (pure)
* :mod:`~amqp_events.console.chart`: the charts, as inline SVG (pure)
* :mod:`~amqp_events.console.fleet`: reading and changing, through the library's own operations
* :mod:`~amqp_events.console.api`, :mod:`~amqp_events.console.pages`, :mod:`~amqp_events.console.web`: the
  web application (Starlette, Jinja2)
"""
