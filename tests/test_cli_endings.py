"""The one table every ``car`` command ends by: each kind of exception to the exit status
``car --help`` documents and the error line printed."""

from __future__ import annotations

import re
import sqlite3

import pytest
import typer

from car_core.cli import kit
from car_core.cli.app import _ENDINGS, EXIT_CODES, OUT_OF_MEMORY, Ending, ending
from car_core.errors import (
    AttributionBusy,
    BranchesFailed,
    BudgetExhausted,
    CorruptRun,
    InvalidInput,
    NothingToAttribute,
    RunNotFound,
)


@pytest.mark.parametrize(("exc", "code"), [
    (NothingToAttribute("no locus"), kit.NOTHING),
    (InvalidInput("bad flag"), kit.USAGE),
    (BudgetExhausted("spent"), kit.BUDGET),
    (RunNotFound("no such run"), kit.STORE),
    (AttributionBusy("taken"), kit.STORE),
    (CorruptRun("edited"), kit.STORE),  # a RunError
    (BranchesFailed("every branch failed"), kit.AGENT),
])
def test_cars_errors_end_with_their_documented_status_and_their_own_message(exc, code):
    assert ending(exc) == Ending(code, str(exc))


def test_what_is_around_the_command_ends_it_as_documented(monkeypatch):
    monkeypatch.delenv("CAR_DEBUG", raising=False)
    assert ending(KeyboardInterrupt()) == Ending(kit.INTERRUPTED, "interrupted")
    assert ending(MemoryError()) == Ending(kit.BUDGET, OUT_OF_MEMORY)
    assert ending(kit.OutputClosed("stdout")) == Ending(kit.CLOSED_PIPE, "")  # quietly
    exited = ending(SystemExit(3))
    assert exited is not None and exited.code == kit.AGENT and "sys.exit(3)" in exited.message
    bug = ending(ZeroDivisionError("oops"))
    assert bug is not None and bug.code == kit.INTERNAL
    assert bug.message.startswith("internal error: ZeroDivisionError: oops")


def test_sqlites_own_failure_is_a_store_error_worded_by_the_command():
    damaged = sqlite3.DatabaseError("database disk image is malformed")
    assert ending(damaged) == Ending(kit.STORE, "the store cannot be read: database disk image "
                                                "is malformed")
    assert ending(damaged, "the store failed") == Ending(
        kit.STORE, "the store failed: database disk image is malformed")


def test_a_commands_own_exit_and_a_debug_runs_bug_are_not_the_tables(monkeypatch):
    assert ending(typer.Exit(1)) is None
    monkeypatch.setenv("CAR_DEBUG", "1")
    assert ending(ValueError("oops")) is None  # re-raised with its traceback
    assert ending(InvalidInput("bad flag")) == Ending(kit.USAGE, "bad flag")


def test_every_status_in_the_table_is_documented_in_the_help():
    documented = {int(n) for n in re.findall(r"(?:^|· )(\d+) ", EXIT_CODES.replace("\n", " "))}
    assert {code for _, code, _ in _ENDINGS} <= documented
