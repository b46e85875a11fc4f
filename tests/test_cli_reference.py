"""The CLI reference in docs/cli.md is what the parsers print: every command's ``--help``, and
no command that is gone (``python tests/support/cli_reference.py --write`` after a change)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
import cli_reference  # noqa: E402


@pytest.mark.slow  # one `car ... --help` process per command, about 3 s each on 2 cores
def test_the_cli_reference_is_what_the_parsers_print() -> None:
    assert cli_reference.current() == cli_reference.render(), (
        "docs/cli.md's CLI reference is stale: run "
        "`.venv/bin/python tests/support/cli_reference.py --write`")


def test_the_reference_lists_every_command_of_car_help() -> None:
    listed = cli_reference._commands(cli_reference._help([]))
    assert {"attribute", "report", "runs", "show", "what", "fix"} <= set(listed)
    for name in listed:
        assert f"## `car {name}`" in cli_reference.current()
