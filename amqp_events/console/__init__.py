"""The operator console (``amqp-events console``, the ``console`` extra): every service of a vhost in a browser,
their failures grouped by cause, replay, edit and retry, purge, pause and resume, the event log of what operators
did, through a JSON API scripts can use too.

* :mod:`~amqp_events.console.discovery`: the services found by the library's queue names (pure)
* :mod:`~amqp_events.console.overview`: the fleet at a glance, a row per service, problems first (pure)
* :mod:`~amqp_events.console.security`: who may look, who may change (pure)
* :mod:`~amqp_events.console.index`: each archive as last read, browsed again only when it changed
* :mod:`~amqp_events.console.watch`: the vhost read in the background, for pages that never wait on it
* :mod:`~amqp_events.console.audit`: the event log
* :mod:`~amqp_events.console.fleet`: reading and changing, through the library's own operations
* :mod:`~amqp_events.console.api`, :mod:`~amqp_events.console.pages`, :mod:`~amqp_events.console.web`: the
  web application (Starlette, Jinja2)
"""
