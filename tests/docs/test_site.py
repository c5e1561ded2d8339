"""The documentation site built as CI builds it (``mkdocs build --strict``) and read in a headless browser."""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from docs_pages import ROOT

from amqp_events.settings import ENVIRONMENT, SETTING_PREFIX, Settings

#: Where the screenshots of the site's pages are written (checked in).
SCREENSHOTS = ROOT / "docs" / "images" / "site"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site, built strictly, served over HTTP on a free port; its URL."""
    directory = tmp_path_factory.mktemp("site")
    mkdocs = str(Path(sys.executable).parent / "mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(directory)], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    handler = functools.partial(QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(10)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def test_the_settings_reference_lists_every_setting_from_the_code(site, browser):
    page = browser.new_page()
    page.goto(f"{site}/reference/settings/", timeout=30_000)
    table = page.locator("table").first.inner_text()
    for name in Settings.__dataclass_fields__:
        assert f"{SETTING_PREFIX}{name}" in table
    assert all(variable in page.content() for variable in ENVIRONMENT)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "settings.png")


def test_the_home_page_and_a_guide_read_as_written(site, browser):
    page = browser.new_page()
    page.goto(f"{site}/", timeout=30_000)
    assert "Reliable domain events" in page.inner_text("article")
    page.screenshot(path=SCREENSHOTS / "home.png")
    page.get_by_role("link", name="the archive", exact=True).first.click()
    page.wait_for_url("**/guides/archive/", timeout=30_000)
    assert page.locator("h1").inner_text().startswith("The archive and replay")
    assert "amqp-events -A shipping archive replay" in page.inner_text("article")
    page.screenshot(path=SCREENSHOTS / "guide.png")


def test_the_command_line_and_api_references_come_from_the_code(site, browser):
    import amqp_events
    from amqp_events.cli import main

    page = browser.new_page()
    page.goto(f"{site}/reference/cli/", timeout=30_000)
    text = page.inner_text("article")
    assert all(f"amqp-events {name}" in text for name in main.commands)
    page.goto(f"{site}/reference/api/", timeout=30_000)
    text = page.inner_text("article")
    exceptions = [name for name in amqp_events.__all__ if isinstance(getattr(amqp_events, name), type)
                  and issubclass(getattr(amqp_events, name), Exception)]  # fmt: skip
    assert exceptions and [name for name in exceptions if name not in text] == []
    assert re.findall(r":(?:class|func|meth|attr):", text) == []  # the docstrings' Sphinx roles, shown as code
    assert amqp_events.events_app.__doc__.split("\n", 1)[0].replace("``", "") in " ".join(text.split())
