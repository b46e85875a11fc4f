"""The layout page's table of car_core (docs/layout.md) is checked against the tree: it names
every top-level module and package of car_core, and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "car_core"


def table_names() -> set[str]:
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    start = text.index("| folder or module | what it holds |")
    rows = [line for line in text[start:].splitlines()[2:] if line.startswith("|")]
    firsts = [row.split("|")[1] for row in rows]
    return {name.rstrip("/") for cell in firsts for name in re.findall(r"`([\w/]+)`", cell)}


def tree_names() -> set[str]:
    modules = {p.stem for p in CORE.glob("*.py") if p.name != "__init__.py"}
    packages = {p.name for p in CORE.iterdir() if (p / "__init__.py").is_file()}
    return modules | packages


def test_the_table_names_every_module_and_folder_and_nothing_that_is_gone() -> None:
    named, present = table_names(), tree_names()
    assert len(present) > 10
    assert present - named == set(), f"add these to docs/layout.md: {sorted(present - named)}"
    assert named - present == set(), f"gone from car_core: {sorted(named - present)}"
