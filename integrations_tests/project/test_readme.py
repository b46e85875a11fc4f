"""The README and the docs pages cannot go stale: every fenced block that is not code to type is
generated output that must equal what the code prints now, a measurement that names its command,
the ``car`` synopsis (checked against the parsers), the layout (checked against the tree) or a
command's ``--help`` (checked by tests/test_cli_reference.py).

``python tests/support/readme_outputs.py --write`` rewrites the output blocks after a deliberate
change; see that module for what is masked (ids, dates, seconds) and why nothing else is.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))
import readme_outputs as docs  # noqa: E402

PAGES = docs.all_blocks()  # (page, block) for README.md and every docs page
BLOCKS = [b for _, b in PAGES]
OUTPUTS = [b for b in BLOCKS if b.kind == "output"]


def _where(block: docs.Block) -> str:
    page = next(p for p, b in PAGES if b is block)
    return f"{page.relative_to(docs.ROOT)}:{block.start + 1}"


def test_every_block_that_is_not_code_says_what_it_is() -> None:
    unmarked = [_where(b) for b in BLOCKS if b.kind is None and b.tag not in ("python", "bash")]
    assert unmarked == [], f"blocks without a marker at {unmarked}"
    assert {b.arg for b in OUTPUTS} <= set(docs.PRODUCERS)
    assert len({b.arg for b in OUTPUTS}) == len(OUTPUTS)  # one block per producer


@pytest.mark.parametrize("name", [b.arg for b in OUTPUTS])
def test_an_output_block_is_what_the_code_prints(name: str) -> None:
    block = next(b for b in OUTPUTS if b.arg == name)
    assert docs.mask(docs.produce(name)) == docs.mask(block.text), (
        f"output block '{name}' ({_where(block)}) is stale: run "
        f"`.venv/bin/python tests/support/readme_outputs.py --write {name}`")


def test_a_measured_block_names_a_command_that_exists() -> None:
    measured = [b for b in BLOCKS if b.kind == "measured"]
    assert measured
    for block in measured:
        args = shlex.split(block.arg)
        script = next(a for a in args if a.endswith(".py"))
        assert (docs.ROOT / script).is_file(), f"{_where(block)}: {script} is missing"


def _synopsis(block: docs.Block) -> dict[str, set[str]]:
    """The options each ``car <command>`` of the synopsis shows."""
    shown: dict[str, set[str]] = {}
    command = None
    for line in block.text.splitlines():
        if line.startswith("car "):  # a new command line; "car --version" is none's option
            m = re.match(r"^car (\w+)", line)
            command = m.group(1) if m else None
            if command:
                shown.setdefault(command, set())
        if command:
            # "--no-progress" is the off switch of the "--progress / --no-progress" flag
            shown[command] |= {f"--{o.removeprefix('no-')}" if o == "no-progress" else f"--{o}"
                               for o in re.findall(r"--([a-z][a-z-]*)", line)}
    return shown


def test_the_synopsis_names_exactly_the_options_of_each_command() -> None:
    import typer.main

    from car_core.cli import app

    shown: dict[str, set[str]] = {}
    for block in (b for b in BLOCKS if b.kind == "synopsis"):
        for name, options in _synopsis(block).items():
            shown.setdefault(name, set()).update(options)
    group = typer.main.get_command(app)
    assert shown == {name: _options(command)
                     for name, command in group.commands.items()}  # type: ignore[attr-defined]


def _options(command: object) -> set[str]:
    """A command's long options; a command group's are its subcommands' (``car export pairs``)."""
    subcommands = getattr(command, "commands", None)
    if subcommands:
        return set().union(*(_options(c) for c in subcommands.values()))
    return {o for p in command.params for o in p.opts  # type: ignore[attr-defined]
            if o.startswith("--")} - {"--help"}


def test_the_layout_draws_every_package_folder_and_nothing_that_is_gone() -> None:
    (block,) = [b for b in BLOCKS if b.kind == "layout"]
    drawn, parents = set(), []
    for line in block.text.splitlines():
        m = re.match(r"^( *)(\S+/)\s", line + " ")
        if not m:
            continue
        depth = len(m.group(1)) // 2
        parents[depth:] = [m.group(2)]
        drawn.add("".join(parents))
    for folder in drawn:
        assert (docs.ROOT / folder).is_dir(), f"the layout draws {folder}, which does not exist"
    packages = {str(p.parent.relative_to(docs.ROOT)) + "/"
                for top in ("adapters", "car_core", "integrations_tests")
                for p in (docs.ROOT / top).rglob("__init__.py")}
    assert packages <= drawn, f"not drawn: {sorted(packages - drawn)}"


def test_the_readme_stays_a_short_front_door() -> None:
    lines = docs.README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to a docs page"
