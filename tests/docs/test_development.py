"""The development page's own commands, at a size the suite can afford: the soak."""

from __future__ import annotations

import subprocess
import sys

import pytest
from docs_pages import ROOT, page

pytestmark = pytest.mark.timeout(300)


def test_the_soak_runs_as_the_development_page_says():
    assert "`python -m bench.soak`" in page("development.md")
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "3000"], cwd=ROOT, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("3,000 handled once each, 0 lost, 0 duplicates") == 3, done.stdout
