"""The docstrings' Sphinx-style references (``:mod:``, ``:func:``, ``:class:``...) name what exists: a module moved
or a function renamed must not leave a reader looking for it (no broker)."""

from __future__ import annotations

import dataclasses
import importlib
import re

from helpers import ROOT

PACKAGE = ROOT / "amqp_events"
REFERENCE = re.compile(r":(mod|func|class|meth|data|attr|exc):`~?(amqp_events(?:\.\w+)*)`")


def resolves(name: str) -> bool:
    """Does ``name`` import as a module, or as a module's attribute (a dataclass's field counts)?"""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            fields = getattr(found, "__dataclass_fields__", {}) if dataclasses.is_dataclass(found) else {}
            if part in fields:
                return part == parts[-1]
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


def test_every_reference_in_a_docstring_names_something_that_exists():
    missing = [
        f"{path.relative_to(PACKAGE.parent)}: {found[2]}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for found in REFERENCE.finditer(path.read_text())
        if not resolves(found[2])
    ]
    assert missing == []
