"""The README and the documentation site: what every page must hold, and the examples that need the harness's
own broker (one it stops). The pages' files run as written in ``tests/docs/guides/``."""

from __future__ import annotations

import re
import sys
import threading
import time

import pytest
import tomllib
from docs_pages import ALL_PAGES, PAGES, ROOT, code_blocks, named_blocks, page, write_blocks

from amqp_events.testing import wait_for


def test_firing_again_under_the_id_in_doubt_works_as_written(tmp_path, rabbitmq, broker_url, start_worker):
    if rabbitmq.node is None:
        pytest.skip("needs the harness's own node (not $AMQP_URL) to stop it")
    write_blocks(tmp_path, broker_url, "orders/celery.py", "orders/handlers.py", "orders/refire.py")
    orders = start_worker("orders.celery", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
    sys.path.insert(0, str(tmp_path))
    try:
        from orders.refire import fire_until_confirmed

        fire_until_confirmed("billing.invoice.paid", {"invoice_id": 6, "amount": "1"})
        wait_for(lambda: "invoice 6 paid: 1" in orders.log(), 30, what="the worker consuming")
        rabbitmq.node.stop()
        fired: list[str] = []
        firing = threading.Thread(
            target=lambda: fired.append(fire_until_confirmed("billing.invoice.paid", {"invoice_id": 7, "amount": "1"}))
        )
        firing.start()
        time.sleep(12)  # longer than the publish timeout (10 s): at least one attempt raised PublishError
        rabbitmq.node.start()
        firing.join(60)
        assert len(fired) == 1
    finally:
        sys.modules["orders.celery"].app.close()
        sys.path.remove(str(tmp_path))
        for module in [name for name in sys.modules if name == "orders" or name.startswith("orders.")]:
            del sys.modules[module]
    wait_for(lambda: "invoice 7 paid: 1" in orders.log(), 30, what="the event fired again, handled")


def test_every_python_block_runs_in_the_suite_or_is_a_fragment_on_purpose():
    tests = "".join(path.read_text() for path in (ROOT / "tests").rglob("test_*.py"))
    named, fragments, neither = set(), [], []
    for path, text in PAGES.items():
        for mark, body in re.findall(r"(<!-- fragment: [^>]+ -->\n)?```python\n(.*?)```", text, flags=re.S):
            compile(body, path, "exec")  # fragments too: at least they parse
            first = body.split("\n", 1)[0]
            if mark:
                fragments.append(first)
            elif re.fullmatch(r"# \S+\.py", first):
                named.add(first[2:])
            else:
                neither.append(f"{path}: {first}")
    assert neither == []
    assert [name for name in named if f'"{name}"' not in tests] == []  # each named block is written by a test
    assert (len(named), len(fragments)) == (37, 12)


def test_a_file_named_on_two_pages_is_the_same_file():
    bodies: dict[str, set[str]] = {}
    for _, name, body in named_blocks():
        bodies.setdefault(name, set()).add(body)
    assert {name for name, found in bodies.items() if len(found) > 1} == set()


def test_the_readme_is_a_landing_page_whose_set_up_commands_come_first():
    readme = page("README.md")
    assert len(readme.splitlines()) < 200
    first_commands = [line.strip() for line in readme.splitlines()[2:4]]
    assert [command.split("#")[0].strip() for command in first_commands] == ["bash scripts/demo", "bash scripts/test"]
    for script in ("demo", "test"):
        assert (ROOT / "scripts" / script).exists()
    linked = re.findall(r"\]\(((?:docs/)?[\w/.-]+\.md)\)", readme)
    assert linked and [path for path in linked if not (ROOT / path).is_file()] == []


def test_every_guide_of_the_site_is_listed_in_the_readme_and_on_the_home_page():
    nav = (ROOT / "mkdocs.yml").read_text()
    guides = re.findall(r":\s*(guides/[\w-]+\.md)\s*$", nav, re.MULTILINE)
    assert len(guides) >= 19
    readme, home = page("README.md"), page("index.md")
    assert [guide for guide in guides if f"](docs/{guide})" not in readme] == []
    assert [guide for guide in guides if f"]({guide})" not in home] == []


def test_every_install_line_names_the_release_it_needs():
    # Unversioned, pip would take 0.1.0 from the package index without a word: a version makes it fail loudly.
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    minor = ".".join(version.split(".")[:2])
    lines = re.findall(r"pip install [^`\n]*celery-amqp-events[^`\n]*", page("README.md") + ALL_PAGES)
    assert lines
    for line in lines:
        named = re.findall(r"celery-amqp-events(?:\[[\w,-]+\])?([<>=~!][^\s\"']*)?(?![\w/-])", line)
        assert named and all(spec == f">={minor}" for spec in named), line


def test_every_app_a_command_names_is_a_module_the_pages_write():
    # topology.md once said `-A orders.app` where the pages write orders/celery.py: "No module named 'orders.app'".
    written = set(code_blocks())
    named = set(re.findall(r"-A ([a-z_][\w.]*)", page("README.md") + ALL_PAGES))
    assert named
    # Celery's -A takes a module, or a package whose celery module holds the app.
    missing = {app for app in named if not {f"{app.replace('.', '/')}.py", f"{app}/celery.py"} & written}
    assert missing == set()


def test_the_metrics_page_and_the_metric_name_every_outcome():
    from amqp_events.middleware.metrics import OUTCOMES

    row = next(line for line in page("guides/metrics.md").splitlines() if "handler_outcomes_total" in line)
    # Read from the source: making the instruments here would fix this test process's registry for the others.
    source = (ROOT / "amqp_events" / "metrics" / "__init__.py").read_text()
    help_text = re.findall(r'"Runs by outcome: ([^"]+)"', source)[0]
    assert [outcome for outcome in OUTCOMES if f"`{outcome}`" not in row or outcome not in help_text] == []


def test_the_extras_bring_what_their_names_say():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not any("psycopg" in requirement for requirement in extras["sqlalchemy"] + extras["django"])
    assert any("psycopg" in requirement for requirement in extras["postgres"])
    assert [requirement.split(">")[0] for requirement in extras["testing"]] == ["pytest"]


def test_every_test_the_pages_name_exists():
    """The "shown by" columns and paragraphs name tests (``broker/test_archive.py::test_...``, by the tier's
    directory): renaming or moving one must not leave a dangling reference."""
    named = set(re.findall(r"((?:[a-z]+/)?test_\w+\.py)::(test_\w+)", ALL_PAGES))
    assert named
    missing = [
        f"{module}::{test}"
        for module, test in sorted(named)
        if not re.search(rf"^def {test}\(", (ROOT / "tests" / module).read_text(), flags=re.M)
    ]
    assert missing == []
