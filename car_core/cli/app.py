"""The ``car`` app every command is added to, and what the commands share: the consoles (every
secret redacted from what they write), the option aliases, the one table from an exception to
the exit status and error line a command ends with, and ``main``, which runs the app as a
process (usage errors, Ctrl-C, SIGTERM). The commands live one group to a module beside this
one; ``car_core.cli`` adds them to ``app`` in the order ``car --help`` lists them."""

from __future__ import annotations

import functools
import io
import os
import signal
import sqlite3
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple, TypeVar

import typer
from rich.text import Text

from car_core.cli import kit
from car_core.engine.execution import WaitedOneAtATime
from car_core.errors import (
    AgentError,
    BudgetExhausted,
    CarError,
    InvalidInput,
    NothingToAttribute,
    RunError,
    StoreError,
)
from car_core.model.json_values import dumps
from car_core.secrets.redact import redact

EXIT_CODES = """Exit codes: 0 ok · 1 nothing attributable (no locus) · 2 usage or bad input
(also a run recorded with another agent, or a tool no list classifies) · 3 budget exhausted
(the result is truncated, what was measured is kept; or undecided, more re-runs needed) or
memory ran out · 4 store or run error (no store, unknown id, not a CAR store, damaged or
edited store, read-only folder, attribution busy) · 5 the agent under test failed, a model
server it or the outcome calls was down (resume once it is up), or its shape was refused
before any branch (the message says what to change; also when every branch failed, or its
code or the outcome's called sys.exit) ·
70 internal error · 130 interrupted (Ctrl-C; finished branches are kept, resume with --resume)
· 141 the output was closed by its reader (`car show RUN | head`), as git ends."""

app = typer.Typer(
    name="car", add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Causal Agent Replay: find the step that caused an agent's failure by intervening on "
         "recorded steps and re-running the agent.",
    epilog=EXIT_CODES)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version
        try:
            shown = version("causal-agent-replay")
        except PackageNotFoundError:  # run from a source tree that was never installed
            shown = "unknown (not installed)"
        STDOUT.write(f"car (causal-agent-replay) {shown}\n")
        raise typer.Exit(0)


@app.callback()
def _car(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True,
        help="Print the installed causal-agent-replay version and exit.")] = False) -> None:
    """Causal Agent Replay: find the step that caused an agent's failure by intervening on
    recorded steps and re-running the agent."""


# -- the consoles ------------------------------------------------------------------------------
class _Redacting(io.TextIOBase):
    """The current ``sys.stdout``/``sys.stderr`` (looked up at each write, so captures work)
    with every secret redacted from what is written."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def _target(self) -> Any:
        return getattr(sys, self._name)

    def write(self, text: str) -> int:
        try:
            self._target.write(redact(text))
        except BrokenPipeError:  # the reader went away (`car show RUN | head -1`)
            raise kit.closed_pipe(self._name) from None
        return len(text)

    def flush(self) -> None:
        try:
            self._target.flush()
        except BrokenPipeError:
            raise kit.closed_pipe(self._name) from None

    def isatty(self) -> bool:
        return bool(self._target.isatty())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self._target, "encoding", None) or "utf-8")


STDOUT: Any = _Redacting("stdout")
STDERR: Any = _Redacting("stderr")
# Piped output is not cut at 80 columns: scripts and captures get whole tables.
out = kit.Console(file=STDOUT, highlight=False, soft_wrap=True, stream="stdout",
                  width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", 120)))
err = kit.Console(file=STDERR, highlight=False, stream="stderr")


def print_json(value: Any) -> None:
    STDOUT.write(kit.json_line(dumps(value)) + "\n")


# -- the options several commands take, each defined once ----------------------------------------
StoreOpt = Annotated[str, typer.Option("--store", help="SQLite store of runs.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
ReverseOpt = Annotated[bool, typer.Option(
    "--reverse", help="Oldest first (the default is newest first).")]
ProgressOpt = Annotated[bool | None, typer.Option(
    "--progress/--no-progress", help="Progress bar on stderr (default: when it is a terminal).")]
AgentOpt = Annotated[str, typer.Option(
    "--agent", help="MODULE:FACTORY; FACTORY() returns the agent (imported from the current "
                    "folder).")]
OutcomeOpt = Annotated[str | None, typer.Option(
    "--outcome", help="MODULE:FUNCTION scoring a run in [0, 1] (1 = the failure happened).")]
ForceAgentOpt = Annotated[bool, typer.Option(
    "--force-agent", help="Use --agent even when it is not the agent the run was recorded with "
                          "(same agent under a new name or tools).")]
AgentNameOpt = Annotated[str | None, typer.Option(
    "--agent-name", help="Only runs recorded by the agent of this name.")]
SinceOpt = Annotated[str | None, typer.Option(
    "--since", help="Only runs recorded at or after this date (ISO) or epoch second.")]
UntilOpt = Annotated[str | None, typer.Option(
    "--until", help="Only runs recorded at or before this date (ISO) or epoch second.")]
TestOpt = Annotated[str | None, typer.Option(
    "--test", help="Only runs recorded by a test whose id contains this.")]
SessionOpt = Annotated[str | None, typer.Option(
    "--session", help="Only runs recorded in this pytest session (its id, as the plugin's "
                      "summary prints it).")]
RunsAtOnceOpt = Annotated[int | None, typer.Option(
    "--runs-at-once", min=1, show_default=False,
    help="Runs attributed at once (default: 4 for an agent that waits on a model server, "
         "else 1); the result is the same whatever it is.")]
MaxRolloutsOpt = Annotated[int, typer.Option(
    "--max-rollouts", min=1, help="Refuse more rollouts than this in one arm (raise it "
                                  "knowingly).")]

MAX_SEED = 2**63 - 1  # stored with every branch, in an SQLite INTEGER


def check_seed(seed: int) -> None:
    if not 0 <= seed <= MAX_SEED:
        raise InvalidInput(f"--seed {seed} is outside 0 … 2**63 - 1",
                           hint="pass a smaller non-negative seed, e.g. --seed 0")


# -- how a command ends ------------------------------------------------------------------------
OUT_OF_MEMORY = ("out of memory: this machine cannot hold what was asked for; lower --rollouts "
                 "or --concurrency, or cap the run with --budget")


class Ending(NamedTuple):
    """How a command that raised ends: its exit status and its one error line (empty: it ends
    quietly, as when nobody is reading its output)."""

    code: int
    message: str


def _internal(exc: BaseException) -> str | None:
    """An unexpected error: one line asking for a report, or None (re-raised, traceback and
    all) under ``CAR_DEBUG=1``."""
    if os.environ.get("CAR_DEBUG"):
        return None
    return (f"internal error: {type(exc).__name__}: {str(exc)[:200]} (set CAR_DEBUG=1 for the "
            "traceback and report it)")


# Every command's exceptions, to the exit status ``car --help`` documents and the line printed
# (given the exception and how the store's own failure is worded). The first row that matches
# wins, so a subclass's row comes before its base's; a message of None (a debug run's
# unexpected error) is not the command's to handle and is re-raised.
_ENDINGS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int,
                      Callable[[BaseException, str], str | None]], ...] = (
    (kit.OutputClosed, kit.CLOSED_PIPE, lambda exc, store: ""),  # quietly, as git ends
    ((KeyboardInterrupt, typer.Abort), kit.INTERRUPTED, lambda exc, store: "interrupted"),
    (MemoryError, kit.BUDGET, lambda exc, store: OUT_OF_MEMORY),
    (NothingToAttribute, kit.NOTHING, lambda exc, store: str(exc)),
    (BudgetExhausted, kit.BUDGET, lambda exc, store: str(exc)),
    ((StoreError, RunError), kit.STORE, lambda exc, store: str(exc)),
    (AgentError, kit.AGENT, lambda exc, store: str(exc)),
    (CarError, kit.USAGE, lambda exc, store: str(exc)),
    # a sys.exit in the user's code is the agent's failure, never a silent success
    (SystemExit, kit.AGENT, lambda exc, store: kit.exited(exc)),  # type: ignore[arg-type]
    (sqlite3.Error, kit.STORE, lambda exc, store: f"{store}: {exc}"),  # SQLite saw damage
    (Exception, kit.INTERNAL, lambda exc, store: _internal(exc)),
)


def ending(exc: BaseException, store: str = "the store cannot be read") -> Ending | None:
    """How a command that raised ``exc`` ends (``_ENDINGS``), or None when it is not the
    command's to handle. ``store`` words SQLite's own failure (a command that writes says
    the store failed, not that it cannot be read)."""
    if isinstance(exc, typer.Exit):  # the command chose its own status
        return None
    for kinds, code, message in _ENDINGS:
        if isinstance(exc, kinds):
            said = message(exc, store)
            return None if said is None else Ending(code, said)
    return None


def say(message: str) -> None:
    """The one error line a command ends with, on stderr."""
    err.print(Text(f"car: error: {kit.safe(message)}"), soft_wrap=True)


def fail(message: str, code: int) -> typer.Exit:
    """Print ``message`` as the command's error line; the exit to raise with ``code``."""
    say(message)
    return typer.Exit(code)


F = TypeVar("F", bound=Callable[..., Any])


def errors(fn: F) -> F:
    """The command ``fn`` ending as ``_ENDINGS`` says, never with a traceback: CAR's errors, a
    sys.exit from the user's code (named as the agent's or the outcome's), a damaged file
    SQLite reports itself, Ctrl-C, memory, and anything unexpected (70; ``CAR_DEBUG=1``
    re-raises it). A closed output pipe ends quietly (141, as git does)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            end = ending(exc)
            if end is None:
                raise
            if not end.message:
                raise typer.Exit(end.code) from None
            raise fail(end.message, end.code) from None
    return wrapper  # type: ignore[return-value]


# -- the process -------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``car`` console script; returns the exit status. A usage error is
    one line (with where to read the help), like every other error."""
    try:  # typer >= 0.20 vendors click; older ones use it directly
        from typer._click import exceptions as cx
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click import exceptions as cx  # type: ignore[no-redef]
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _unraisable_hook(previous_hook)
    previous_show = warnings.showwarning
    warnings.showwarning = plain_warnings(previous_show)
    previous_term = _on_sigterm()
    try:
        return _main(argv, cx)
    finally:
        warnings.showwarning = previous_show
        sys.unraisablehook = previous_hook
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)


def plain_warnings(previous: Callable[..., Any]) -> Callable[..., None]:
    """CAR's own warnings (an agent's caveat, a side-effect tool matched on free text) as one
    line, "car: warning: ...", as the errors are: Python's form named a file and line of
    CAR's source and printed that source line, which reads as a crash. Anyone else's warning
    keeps Python's form."""
    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        if issubclass(category, WaitedOneAtATime):
            return  # the command says it in its own words (``kit.waiting_hint``)
        if category.__module__.split(".")[0] in ("car_core", "car_adapters"):
            err.print(Text(f"car: warning: {kit.safe(str(message))}", style="yellow"),
                      soft_wrap=True)
            return
        previous(message, category, filename, lineno, file, line)
    return show


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a CI runner's timeout), raised where the command is so that it
    unwinds as a Ctrl-C does: every ``finally`` runs (a read's private copy of the store is
    removed, an attribution's lease freed, its branches kept for a resume) instead of the
    process vanishing mid-way."""


def _on_sigterm() -> Any:
    """Turn SIGTERM into ``Terminated`` while the command runs (main thread only, where
    Python delivers signals); the handler it replaced, to restore, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminated(signum: int, frame: Any) -> None:
        raise Terminated()

    try:
        return signal.signal(signal.SIGTERM, terminated)
    except (ValueError, OSError):  # an embedding that owns its signals
        return None


def _unraisable_hook(previous: Callable[[Any], Any]) -> Callable[[Any], None]:
    """An error in a finalizer while the command runs: a MemoryError there is the one the
    command already reports (printing it would need memory too, and its failure would print
    "Exception ignored in sys.unraisablehook"); anything else goes to the usual hook, whose
    own failure is dropped rather than printed."""
    def hook(info: Any) -> None:
        if isinstance(info.exc_value, MemoryError) or info.exc_type is MemoryError:
            return
        try:
            previous(info)
        except BaseException:  # a hook must never raise
            pass
    return hook


def _main(argv: list[str] | None, cx: Any) -> int:
    try:
        code = app(args=argv, prog_name="car", standalone_mode=False)
    except cx.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `car`: the help, as a usage error
            exc.show()
            return kit.USAGE
        name = exc.ctx.command_path if exc.ctx is not None else "car"
        say(f"{exc.format_message()} (see `{name} --help`)")
        return kit.USAGE
    except cx.ClickException as exc:
        say(exc.format_message())
        return int(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt, MemoryError, kit.OutputClosed) as exc:
        end = ending(exc)
        assert end is not None  # each has a row in _ENDINGS
        if end.message:
            say(end.message)
        return end.code
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return code if isinstance(code, int) else 0
