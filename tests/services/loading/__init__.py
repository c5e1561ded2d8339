"""One app per way Celery loads handler modules; each registers a handler of ``loading.ping``.

* ``by_imports``: the ``imports`` setting;
* ``by_include``: the ``include`` setting;
* ``by_cli``: nothing in the app; the worker is given ``--include services.loading.cli_handlers``;
* ``by_autodiscovery``: ``app.autodiscover_tasks()``, as Django projects do;
* ``without_handlers``: no handler anywhere (the worker must say so loudly).
"""
