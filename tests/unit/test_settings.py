"""Settings, safe defaults and environment variables: no broker."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from docs_pages import ALL_PAGES

import amqp_events
from amqp_events import SettingsFrozen, events_app
from amqp_events.breakers import BreakerPolicy
from amqp_events.environment import VARIABLES, variable
from amqp_events.settings import BREAKER_POLICY, ENVIRONMENT, Settings, environment_defaults


def test_safe_defaults_are_applied():
    conf = events_app("orders").conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.task_acks_on_failure_or_timeout is False
    assert conf.accept_content == ["json"] and conf.task_serializer == "json"
    assert conf.broker_transport_options["confirm_publish"] is True
    assert not conf.result_backend


def test_any_default_can_be_overridden_by_arguments_or_later_configuration():
    app = events_app("orders", task_acks_late=False)
    assert app.conf.task_acks_late is False
    app.config_from_object({"task_reject_on_worker_lost": False})
    assert app.conf.task_reject_on_worker_lost is False


def test_environment_variables_are_read_when_the_app_is_created(monkeypatch):
    monkeypatch.setenv("AMQP_EVENTS_MAX_RETRIES", "4")
    monkeypatch.setenv("AMQP_EVENTS_ARCHIVED_MESSAGE_TTL", "60000")
    monkeypatch.setenv("AMQP_EVENTS_ARCHIVED_QUEUE_LENGTH", "0")
    app = events_app("orders")
    monkeypatch.setenv("AMQP_EVENTS_MAX_RETRIES", "9")  # too late for this app
    settings = app.events_settings
    assert (settings.max_retries, settings.archive_ttl_ms, settings.archive_max_length) == (4, 60000, 0)


def test_app_settings_take_precedence_over_the_environment(monkeypatch):
    monkeypatch.setenv("AMQP_EVENTS_MAX_RETRIES", "4")
    assert events_app("orders", amqp_events_max_retries=2).events_settings.max_retries == 2


def test_bad_values_are_clear_errors(monkeypatch):
    monkeypatch.setenv("AMQP_EVENTS_MAX_RETRIES", "many")
    with pytest.raises(ValueError, match="AMQP_EVENTS_MAX_RETRIES"):
        environment_defaults()
    with pytest.raises(ValueError, match="max_retries"):
        Settings(max_retries=-1)


def test_the_app_wide_breaker_is_a_setting_checked_when_the_settings_are_read():
    settings = events_app("ledger", amqp_events_breaker={"failures": 5, "open_for": 10}).events_settings
    assert dict(settings.breaker) == {"failures": 5, "open_for": 10}
    with pytest.raises(TypeError):
        settings.breaker["failures"] = 1  # read-only, as the rest of the settings
    with pytest.raises(ValueError, match=r"breaker has unknown key\(s\) failure: it takes failures, window"):
        _ = events_app("ledger", amqp_events_breaker={"failure": 5}).events_settings
    with pytest.raises(ValueError, match="invalid breaker policy"):
        _ = events_app("ledger", amqp_events_breaker={"failures": 0}).events_settings
    assert events_app("ledger", amqp_events_breaker=True).events_settings.breaker is True
    assert events_app("ledger").events_settings.breaker is None


def test_every_environment_variable_is_read_through_the_one_table():
    """Each ``AMQP_EVENTS_*`` name the package or the pages mention is in amqp_events.environment (Django's two
    are Django settings), and no module but that one reads one from the environment itself."""
    django_settings = {"AMQP_EVENTS_OUTBOX_TABLE", "AMQP_EVENTS_INBOX_TABLE"}
    package = Path(amqp_events.__file__).parent
    sources = {path: path.read_text() for path in package.rglob("*.py")}
    mentioned = set(re.findall(r"AMQP_EVENTS_[A-Z_]*[A-Z]", "".join(sources.values()) + ALL_PAGES))
    assert mentioned - django_settings - set(VARIABLES) == set()
    readers = [path.name for path, text in sources.items() if re.search(r"environ(\.get)?\(?\[?.AMQP_EVENTS_", text)]
    assert readers == []
    assert set(ENVIRONMENT) <= set(VARIABLES)
    with pytest.raises(KeyError, match="AMQP_EVENTS_NOPE is not one of"):
        variable("AMQP_EVENTS_NOPE")


def test_settings_may_change_until_the_app_first_needs_them_then_changes_raise():
    app = events_app("orders", amqp_events_max_retries=2)
    app.conf.amqp_events_max_retries = 4
    app.conf.update(amqp_events_backoff_base=2.0)
    app.config_from_object({"amqp_events_archive_max_length": 5})
    settings = app.events_settings  # read now, as by a first fire or a worker's start
    assert (settings.max_retries, settings.backoff_base, settings.archive_max_length) == (4, 2.0, 5)
    with pytest.raises(SettingsFrozen, match="amqp_events_max_retries cannot change now"):
        app.conf.amqp_events_max_retries = 5
    with pytest.raises(SettingsFrozen, match="amqp_events_exchange"):
        app.conf.update(amqp_events_exchange="elsewhere", task_acks_late=True)
    with pytest.raises(SettingsFrozen, match="amqp_events_archive_max_length"):
        app.config_from_object({"amqp_events_archive_max_length": 6})
    app.conf.amqp_events_max_retries = 4  # the value it already has
    app.conf.task_default_priority = 3  # Celery's own settings are Celery's business
    assert app.events_settings is settings


def test_the_breaker_setting_takes_exactly_the_fields_of_a_breaker_policy():
    # settings sits below breakers in the layers, so it names the fields; this keeps the two lists one.
    assert tuple(field.name for field in dataclasses.fields(BreakerPolicy)) == BREAKER_POLICY
