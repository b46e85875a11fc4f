"""Pieces the ``car`` command is built from: loading user code from ``MODULE:NAME``, parsing
``--do`` specs, the rich progress bar the estimators drive, terminal-safe text and the
attribution tables, and the exit statuses. Kept apart from the command modules so that they
only wire flags to calls.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console as RichConsole
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from car_core import defaults, errors
from car_core import formatting as fmt
from car_core.engine.agent import require_agent
from car_core.engine.execution import WAIT_HINT_CPU as WAIT_HINT_CPU  # moved there; kept here
from car_core.engine.execution import WAIT_HINT_SECONDS as WAIT_HINT_SECONDS
from car_core.engine.execution import make_executor, waited_share, waited_words
from car_core.engine.progress import LineProgress, ended_short
from car_core.errors import (
    AgentError,
    CarError,
    InvalidInput,
    InvalidIntervention,
    InvalidJSONValue,
)
from car_core.model.capabilities import positional_arity
from car_core.model.interventions import (
    Intervention,
    do_action,
    do_context,
    do_observation,
    do_resample,
)
from car_core.model.outcome import is_async_callable
from car_core.model.vocabulary import Answer
from car_core.report import compact
from car_core.results import Result, ShapleyResult

# -- exit codes (documented in ``car --help``; ``app.ending`` maps exceptions to them) -----
OK, NOTHING, USAGE, BUDGET, STORE, AGENT, INTERRUPTED = 0, 1, 2, 3, 4, 5, 130
INTERNAL = 70  # an unexpected error inside CAR or a library it uses (EX_SOFTWARE)
# The reader of CAR's output went away (``car show RUN | head -1``): the status the shell
# reports for git, cat and every other tool SIGPIPE ends (128 + 13), so a script can tell the
# output was cut short without an error line in its way. Python ignores SIGPIPE, so CAR ends
# itself the same way, quietly.
CLOSED_PIPE = 141


RESUMABLE = errors.RESUMABLE  # the stops a resume can change (car_core.errors)
resumable = errors.resumable


# -- a closed pipe, and sys.exit from the user's code ------------------------------------------
class OutputClosed(Exception):
    """CAR's own output (stdout or stderr) was closed by its reader: the command ends
    quietly with ``CLOSED_PIPE``. Never raised for the user's code, whose own closed pipe
    (or a rich console of its own calling ``sys.exit(1)``) is the agent's failure."""


def closed_pipe(name: str) -> OutputClosed:
    """``sys.<name>`` was closed by its reader: point its descriptor at the null device, so
    nothing written later (a progress bar's last refresh, the interpreter's final flush)
    fails again or prints "Exception ignored", and give the exception that ends the command."""
    stream = getattr(sys, name, None)
    try:
        fd = stream.fileno() if stream is not None else -1
    except (AttributeError, OSError, ValueError):  # a capture with no descriptor
        fd = -1
    if fd >= 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
    return OutputClosed(name)


class Console(RichConsole):
    """A rich console whose closed pipe ends the command quietly (``OutputClosed``) instead of
    rich's ``SystemExit(1)``, which would read as the user's code calling ``sys.exit``."""

    def __init__(self, *args: Any, stream: str = "stdout", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stream = stream

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise closed_pipe(self._stream)


_EXITED_FROM = "_car_exited_from"  # set on a SystemExit raised by a named piece of user code


def exited(exc: SystemExit) -> str:
    """What the user's code did, for the one error line: whose code called ``sys.exit``
    (the outcome function when its wrapper saw it, else the agent's code)."""
    who = getattr(exc, _EXITED_FROM, None) or "the agent's code"
    return f"{who} called sys.exit({exc.code!r}) instead of returning"


def _naming_exits(fn: Callable[..., Any], who: str) -> Callable[..., Any]:
    """``fn`` (the user's outcome) with a ``sys.exit`` inside it named as ``who``'s. Keeps
    what CAR reads off an outcome: how many positional arguments it takes, whether it is
    ``async def`` (awaited, not sent to a worker thread) and ``settled``."""
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except SystemExit as exc:
            setattr(exc, _EXITED_FROM, who)
            raise

    async def acall(*args: Any) -> Any:
        try:
            return await fn(*args)
        except SystemExit as exc:
            setattr(exc, _EXITED_FROM, who)
            raise

    named: Callable[..., Any]
    two = positional_arity(fn) >= 2
    if is_async_callable(fn):
        if two:
            async def named(run: Any, rng: Any) -> Any:
                return await acall(run, rng)
        else:
            async def named(run: Any) -> Any:
                return await acall(run)
    elif two:
        def named(run: Any, rng: Any) -> Any:
            return call(run, rng)
    else:
        def named(run: Any) -> Any:
            return call(run)
    hook = getattr(fn, "settled", None)
    if callable(hook):
        named.__dict__["settled"] = _naming_exits(hook, f"{who}'s settled()")
    elif hook is not None:
        named.__dict__["settled"] = hook  # refused, with its own message, by OutcomeFn
    named.__name__ = getattr(fn, "__name__", named.__name__)
    named.__qualname__ = getattr(fn, "__qualname__", named.__qualname__)
    return named


# -- terminal-safe text --------------------------------------------------------------------------
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Bidirectional overrides, embeddings, isolates and marks: they reorder what a terminal shows
# (a "Trojan Source" id reads as another), so they are shown as escapes too.
_BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def safe(text: str) -> str:
    """Agent text with control characters (ANSI escapes included) and bidirectional
    overrides shown as escapes, not executed. Print the result as ``rich.text.Text`` (or
    ``cell``) so rich markup in it is not parsed either."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))
    return _BIDI.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def cell(value: Any) -> Text:
    """A table cell or title from stored text: escaped, and never read as rich markup."""
    return Text(safe("" if value is None else str(value)))


def json_line(text: str) -> str:
    """JSON for a terminal or a pipe: bidirectional overrides, DEL and the C1 controls (an
    8-bit CSI starts an escape sequence on some terminals) written as ``\\uXXXX`` escapes,
    still the same JSON value; the encoder escapes the C0 controls already."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def plain(value: Any, limit: int | None = 120) -> Text:
    """A JSON value as one line of rich ``Text`` (never parsed as rich markup); ``limit``
    None keeps it whole."""
    s = safe(compact(value)) if value is not None else "—"
    return Text(s if limit is None or len(s) <= limit else s[: limit - 1] + "…")


# -- loading user code -----------------------------------------------------------------------------
def _raised_on_import(module_name: str, what: str, exc: Exception) -> InvalidInput:
    """The module was found, and raised while it was imported (a missing dependency of its
    own, a bug): telling the user to run car from its folder sent them where they already
    were."""
    return InvalidInput(f"importing {module_name!r} for --{what} raised {exc!r}",
                        hint=f"fix the error in {module_name} (python -c 'import "
                             f"{module_name}' shows its traceback)")


def load_object(spec: str, what: str) -> Any:
    """Import ``MODULE:NAME`` with the current folder on ``sys.path``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidInput(f"{what} {spec!r} is not of the form MODULE:NAME",
                           hint=f"e.g. --{what} my_agent:make_agent")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):  # the module itself
            raise InvalidInput(f"cannot import {module_name!r} for --{what}: {exc!r}",
                               hint=f"run car from the folder that holds {module_name}.py, or "
                                    "give an importable dotted module path") from exc
        raise _raised_on_import(module_name, what, exc) from exc
    except Exception as exc:  # whatever the user's module raised while it was imported
        raise _raised_on_import(module_name, what, exc) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidInput(f"{module_name!r} has no attribute {attr!r} for --{what}",
                               hint=f"check the name after the colon in {spec!r}")
        obj = getattr(obj, part)
    return obj


def built(spec: str, flag: str) -> Any:
    """What the factory ``spec`` (``MODULE:FACTORY``, named by ``--flag``) returns when called
    with no arguments; a spec that is not callable, or a factory that raises, is refused."""
    factory = load_object(spec, flag)
    if not callable(factory):
        raise InvalidInput(f"--{flag} {spec!r} is not callable",
                           hint=f"point --{flag} at a function that returns the {flag}")
    try:
        return factory()
    except CarError:
        raise
    except Exception as exc:
        loopless = "event loop" in str(exc)  # an async checkpointer or client opened here
        raise AgentError(f"--{flag} {spec} raised {exc!r} while building the {flag}",
                         hint=("car calls the factory with no event loop running: open async "
                               "resources in it with the adapter's open_in_background(...) "
                               "(an AsyncSqliteSaver, MCP tools) or connect_in_background("
                               "server) (OpenAI Agents MCP servers)") if loopless else
                         "fix the factory; car calls it with no arguments") from exc


def load_agent_and_outcome(agent_spec: str, outcome_spec: str | None) -> tuple[Any, Any]:
    """``FACTORY()`` gives the agent. A factory that returns a model with ``agent()`` and
    ``outcome`` (a synthetic SCM) supplies both, so ``--outcome`` may be left out."""
    made = built(agent_spec, "agent")
    outcome = None
    if not hasattr(made, "branch") and callable(getattr(made, "agent", None)):
        outcome = getattr(made, "outcome", None)
        made = made.agent()
    require_agent(made, f"what --agent {agent_spec} returned", needs=("start", "branch"))
    if outcome_spec:
        outcome = load_object(outcome_spec, "outcome")
    if outcome is None or not callable(outcome):
        raise InvalidInput("no outcome function", hint="pass --outcome MODULE:FUNCTION")
    return made, _naming_exits(outcome, "the outcome function")


# -- --do specs -----------------------------------------------------------------------------------
def parse_do(spec: str) -> Intervention:
    """``resample:K``, ``action:K:JSON``, ``observation:K:JSON`` or
    ``context:K:MODULE:FUNCTION`` (``FUNCTION(messages)`` returns the edited messages)."""
    kind, _, rest = spec.partition(":")
    step_text, _, payload = rest.partition(":")
    try:
        step = int(step_text)
    except ValueError:
        raise InvalidIntervention(f"--do {spec[:80]!r}: {step_text[:40]!r} is not a step "
                                  "number", hint="use resample:3, action:3:JSON or "
                                                 "observation:2:JSON") from None
    if kind == "resample":
        if payload:
            raise InvalidIntervention(f"--do {spec!r}: resample takes no value",
                                      hint="use resample:3")
        return do_resample(step)
    if kind in ("action", "observation"):
        try:
            value = json.loads(payload)
        except RecursionError:
            raise InvalidJSONValue(f"--do {kind}:{step_text}:…: the value is nested too deep "
                                   "to read", hint="give a flatter JSON value") from None
        except ValueError as exc:
            raise InvalidJSONValue(f"--do {spec[:80]!r}: the value is not JSON ({exc})",
                                   hint="quote it for the shell, e.g. "
                                        "'observation:2:\"refund denied\"'") from None
        return do_action(step, value) if kind == "action" else do_observation(step, value)
    if kind == "context":
        edit = load_object(payload, "do") if payload else None
        if not callable(edit):
            raise InvalidIntervention(f"--do {spec!r}: context needs MODULE:FUNCTION, a "
                                      "function that edits the messages",
                                      hint="use context:2:my_edits:drop_refund_policy")
        return do_context(step, edit)
    raise InvalidIntervention(f"--do {spec[:80]!r}: unknown intervention {kind[:40]!r}",
                              hint="use resample:K, action:K:JSON, observation:K:JSON or "
                                   "context:K:MODULE:FUNCTION")


# -- the store ------------------------------------------------------------------------------
def parse_prices(specs: list[str], path: Path | None = None) -> dict[str, tuple[float, float]]:
    """Model prices per million input and output tokens (``car.Budget.prices``) from
    ``--price MODEL=IN:OUT`` flags and a ``--price-file`` JSON object ``{"MODEL": [IN, OUT]}``;
    a flag overrides the file for the same model."""
    prices: dict[str, tuple[float, float]] = {}
    if path is not None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"--price-file {path}: cannot be read as JSON ({exc})",
                               hint='write {"MODEL": [IN, OUT], ...} per million tokens'
                               ) from None
        if not isinstance(data, dict):
            raise InvalidInput(f"--price-file {path}: not a JSON object",
                               hint='write {"MODEL": [IN, OUT], ...} per million tokens')
        for model, pair in data.items():
            prices[str(model)] = _price_pair(pair, f"--price-file {path}: {model}")
    for spec in specs:
        model, eq, rest = spec.rpartition("=")
        if not eq or not model:
            raise InvalidInput(f"--price {spec!r} is not MODEL=IN:OUT",
                               hint="e.g. --price gpt-4o-mini=0.15:0.60 (per million tokens)")
        prices[model] = _price_pair(rest.split(":"), f"--price {spec}")
    return prices


def _price_pair(pair: Any, where: str) -> tuple[float, float]:
    try:
        pin, pout = (float(x) for x in pair)
    except (TypeError, ValueError):
        raise InvalidInput(f"{where}: need two prices, input and output per million tokens",
                           hint="e.g. 0.15:0.60 (flag) or [0.15, 0.60] (file)") from None
    if not (math.isfinite(pin) and math.isfinite(pout)) or pin < 0 or pout < 0:
        raise InvalidInput(f"{where}: prices must be finite and not negative",
                           hint="e.g. 0.15:0.60 per million tokens")
    return pin, pout


# ``car.Budget``'s limits as ``car attribute``'s flags
BUDGET_FLAGS = {"rollouts": "--budget", "tokens": "--max-tokens", "cost": "--max-cost",
                "wall_time": "--max-seconds"}


def budget_flags(budget: int | Mapping[str, Any] | None) -> list[str]:
    """``--budget N`` for a rollout count; every limit of a budget (``larger_budget``) as its
    flag. A resume that left out a cap would read it back from the stored attribution: a
    resume after ``--max-cost`` tripped, with only ``--budget`` raised, stopped where it had."""
    if budget is None:
        return []
    limits = {"rollouts": budget} if isinstance(budget, int) else budget
    return [part for key, flag in BUDGET_FLAGS.items() if limits.get(key) is not None
            for part in (flag, f"{limits[key]:g}" if isinstance(limits[key], float)
                         else str(limits[key]))]


def uncounted_caps(params: Mapping[str, Any], tokens: int, cost: float,
                   rollouts: int) -> str | None:
    """A token or money cap that counted nothing, in words; None when each cap given counted
    something. Branches whose steps report no ``meta["usage"]`` (nor a cost, nor a priced
    model) spend 0 on the meter, so ``--max-tokens`` never trips: the user read the spend as
    capped while it was not counted at all. Said after the answer, not refused before it:
    whether a branch reports usage is known only once branches ran (a recorded run often
    reports none)."""
    if rollouts <= 0:
        return None
    caps = [params.get("budget") or {}, params.get("per_run") or {}]
    unseen = {"tokens": ("--max-tokens", tokens, "model tokens"),
              "cost": ("--max-cost", cost, "cost and no tokens of a model --price names")}
    said = [f"{flag} capped nothing: the {rollouts} branch(es) reported no {what}"
            for key, (flag, spent, what) in unseen.items()
            if not spent and any(c.get(key) for c in caps)]
    if not said:
        return None
    return ("; ".join(said) + ", so what they spent was not counted (a step's tokens are its "
            "meta[\"usage\"]: CAR's model clients and framework recorders fill it where the "
            "model's reply reports usage; a fake model or a policy of your own must). Cap "
            "--budget or --max-seconds instead")


def resume_below(message: str, exc: BaseException) -> str:
    """``message`` (``exc``'s) without the resume its hint spells out (``resume_said``: a
    generic command's, or the Python call's and the command's for the attribution, triage
    or fix it names), down to "resume the attribution" (or "the triage", "the fix
    population"): a command that prints its own full ``resume_command`` under it says the
    resume once."""
    said = getattr(exc, "resume_said", errors.RESUME_SAME_ID)
    return message.replace(said, said.split(":", 1)[0] if ":" in said
                           else "resume the attribution")


def resume_command(ident: str, budget: int | Mapping[str, Any] | None = None,
                   flags: Sequence[str] = ()) -> str:
    """The command line that was run, with ``--resume IDENT`` (replacing any earlier one) and,
    given ``budget`` (a rollout count, or every limit of one), its flags in place of the ones
    it had; ``flags`` (``["--rollouts", "16"]``) replace theirs likewise."""
    argv = list(sys.argv[1:])
    given = [*budget_flags(budget), *flags]
    for flag in ("--resume", *given[::2]):
        argv = [a for a in argv if not a.startswith(f"{flag}=")]
        while flag in argv:
            i = argv.index(flag)
            del argv[i:i + 2]
    return shlex.join(["car", *argv, *given, "--resume", ident])


def write_out(path: Path, text: str, hint: str) -> None:
    """Write what a command produced to ``--out``, whole or not at all: into a file beside it,
    then renamed over it, so a full disk leaves the file that was there (a trial's good report
    was replaced by a truncated one). A path it cannot write is bad input with what to pass
    instead, not a traceback; a full disk says so."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        part.write_text(text, encoding="utf-8")
        os.replace(part, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            part.unlink()
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        raise InvalidInput(f"cannot write {path}: {exc.strerror}",
                           hint="free space on its disk and run it again" if full else hint
                           ) from None


def existing_store(path: str) -> Any:
    """Open a store that must already exist, read-only: read commands never create, migrate
    or leave a file beside it."""
    from car_core.store.runs import RunStore
    return RunStore(Path(path), readonly=True)


class ExecutorName(StrEnum):
    """The ``--executor`` choices (``car attribute``, ``car triage``, ``car fix``)."""

    sequential = "sequential"
    async_ = "async"
    ray = "ray"


def chosen_executor(name: Any, concurrency: int | None,
              address: str | None = None) -> Any:
    """None lets the estimator choose (sequential for in-process agents, async for model-backed
    ones); otherwise the named backend. ``--concurrency`` alone asks for that many branches at
    once, so it means the async executor: it was ignored without ``--executor`` (a trial's
    ``--concurrency 64`` ran 16)."""
    if name is None and concurrency is None:
        return None
    return make_executor(str(name.value) if name is not None else "async",
                         concurrency=concurrency or defaults.CONCURRENCY, address=address)


# the two options every command that runs branches takes (attribute, triage, fix)
ExecutorOpt = Annotated[ExecutorName | None, typer.Option(
    "--executor", help="How branches run (default: chosen for the agent).")]
ConcurrencyOpt = Annotated[int | None, typer.Option(
    "--concurrency", min=1, help="Branches in flight (async, ray; default 16). Given without "
                                 "--executor: the async executor with that many.")]


# -- progress ------------------------------------------------------------------------------------
class _Rate(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if not speed and task.elapsed:
            speed = task.completed / task.elapsed
        return Text(f"{speed:.1f} rollouts/s" if speed else "– rollouts/s", style="cyan")


class _Left(ProgressColumn):
    """The budget left, or, with no ``--budget``, how many more rollouts the estimate may run
    (its planned count is its cap: n·K for a search). It said "no budget cap" beside a bar
    counting to that cap, which a trial read as a contradiction."""

    def render(self, task: Task) -> Text:
        cap = task.fields.get("budget")
        if cap is not None:
            return Text(f"budget left {max(0, int(cap - task.completed))}", style="yellow")
        if task.total is not None:
            return Text(f"at most {max(0, int(task.total - task.completed))} more",
                        style="yellow")
        return Text("no budget cap", style="dim")


class RichProgress:
    """What the estimators' ``progress=`` expects (``update(n)``, ``close()``), drawn with rich
    on stderr: rollouts done / planned, rollouts per second and the budget left."""

    def __init__(self, label: str, planned: int | None, budget: int | None) -> None:
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), _Rate(), _Left(), TimeElapsedColumn(),
                                 console=Console(stderr=True, stream="stderr"))
        self.task = self.progress.add_task(escape(safe(label)), total=planned, budget=budget)
        self.progress.start()
        self.closed = False

    def update(self, n: int = 1) -> None:
        self.progress.advance(self.task, n)

    def done(self, truncated: bool = False) -> None:
        """The estimate finished. Adaptive stopping often spends less than the budget allowed:
        the bar then ends complete at what was run, and its label says it stopped early and
        how much was allowed, so the total never silently shrinks. ``truncated``: the budget
        ended it (a rollout or two may be left that no pair could use), so the label says the
        budget ran out, as the result does, not that it stopped early."""
        task = self.progress.tasks[0]
        allowed = task.total
        if allowed is not None and task.completed < allowed:
            self.progress.update(self.task, total=task.completed, description=(
                f"{task.description}: {ended_short(truncated, task.completed, allowed)}"))
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.progress.stop()


def make_progress(mode: bool | None, label: str, planned: int | None, budget: int | None
                  ) -> RichProgress | LineProgress | None:
    """A bar when asked (``--progress``) or when stderr is a terminal; else None (pass
    ``bar or False`` to an estimator so it draws no bar of its own). Asked for on a stderr
    that is no terminal (a CI log), plain lines (``LineProgress``): rich drew nothing there
    until the end, then one bar wrapped over three lines."""
    if mode is False or (mode is None and not sys.stderr.isatty()):
        return None
    if not sys.stderr.isatty():
        return LineProgress(safe(label), planned, budget)
    return RichProgress(label, planned, budget)


# -- tables ----------------------------------------------------------------------------------------
# what a step did, on one line: the whole action is in `car show`
_ACTION_CELL: dict[str, Any] = {"no_wrap": True, "overflow": "ellipsis", "max_width": 28}


# the least width "what it did" keeps before the P(fail) columns are left out: with them, an
# 80-column terminal squeezed the step and rescue columns down to nothing
ACTION_LEAST = 20


def table_width(widths: Sequence[int]) -> int:
    """A rich table's width for columns of these content widths (padding and rules)."""
    return sum(widths) + 3 * len(widths) + 1


def attribution_table(r: Result, width: int | None = None) -> Table:
    """The result of ``car attribute`` as a rich table: what each step did and what re-deciding
    it changed (``car_core.formatting.PLAIN_COLUMNS``); the sample sizes are in ``--explain``.
    On a terminal too narrow (``width``) for every column at full width beside
    ``ACTION_LEAST`` of the action, the two P(fail) columns are left out and the table says so;
    the step, rescue and interval columns always keep their full width."""
    actions = r.actions
    if isinstance(r, ShapleyResult):
        t = Table(title="Each step's share of the failure", title_justify="left")
        for col in fmt.PLAIN_SHAPLEY_COLUMNS:
            t.add_column(col, justify="right" if col == fmt.PHI else "left",
                         **_ACTION_CELL if col == fmt.ACTION else {})
        for v in r.values:
            did = (actions[v.step] if v.step is not None and 0 <= v.step < len(actions)
                   else fmt.MISSING)
            t.add_row(Text(safe(str(v.label or f"step {v.step}"))), Text(safe(did)),
                      fmt.effect(v.estimate), fmt.effect_interval(v.ci))
        return t
    rows = [(row, fmt.plain_cells(r, row)) for row in (fmt.step_row(r, s) for s in r.steps)]
    full = {col: max([len(col), *(len(str(c[i])) for _, c in rows)])
            for i, col in enumerate(fmt.PLAIN_COLUMNS) if col != fmt.ACTION}
    narrow = width is not None and width < table_width([*full.values(), ACTION_LEAST])
    cols = [c for c in fmt.PLAIN_COLUMNS if not (narrow and c in (fmt.HELD, fmt.REDRAWN))]
    t = Table(title="What re-deciding each step changed", title_justify="left",
              caption="P(fail) columns left out at this width: --explain has them"
              if narrow else None, caption_justify="left")
    action = dict(_ACTION_CELL)
    if width is not None:  # what is left once the others have their full width
        left = width - table_width([full[c] for c in cols if c != fmt.ACTION]) - 3
        longest = max((len(str(c[1])) for _, c in rows), default=0)
        # a wide terminal shows the whole action: a trial's parallel call read
        # 'called get_order(order_id="…' at 300 columns, the refund beside it cut off
        action["max_width"] = (max(8, min(int(action["max_width"]), left)) if narrow
                               else max(int(action["max_width"]), min(left, longest)))
    for col in cols:
        t.add_column(col, justify="left" if col in (fmt.ACTION, fmt.INTERVAL, "") else "right",
                     **action if col == fmt.ACTION else {"no_wrap": True,
                                                         "min_width": full[col]})
    for row, cells in rows:
        shown = [c for col, c in zip(fmt.PLAIN_COLUMNS, cells, strict=True) if col in cols]
        t.add_row(shown[0], Text(safe(shown[1])), *shown[2:],
                  style="bold red" if row.is_locus else None)
    return t


def verdict(r: Result, who: str | None = None) -> str:
    """The answer in one plain sentence (``car_core.formatting.answer``): which step, what it
    did, how much re-deciding it helps; the method is in ``explain``."""
    return safe(fmt.answer(r, who))


def answer_cell(r: Result | None) -> str:
    """The answer of a stored result in a few words, for the list of attributions."""
    if r is None:
        return "—"
    if isinstance(r, ShapleyResult):
        return "values (truncated)" if r.truncated else "values"
    if r.answer == Answer.LOCUS:
        return f"locus {r.locus}"
    if r.answer == Answer.UNDECIDED:
        return ("undecided" + (f", candidate {r.candidate}" if r.candidate is not None else ""))
    return "no cause"


# -- a slow agent run one branch at a time -------------------------------------------------------
def waiting_hint(chosen: Any, given: Any, seconds: float, cpu: float) -> str | None:
    """What to say when CAR chose to run the branches one at a time (``chosen``, the
    executor it picked; ``given``: the one the user named, None when CAR chose) and the
    process spent most of the estimate waiting rather than computing (``waited_share``): the
    model is likely a server CAR could not tell apart from an in-process one (a custom
    wrapper without ``base_url`` or ``remote=True``), and the branches could have run at
    once."""
    share = waited_share(chosen, given, seconds, cpu)
    if share is None:
        return None
    return waited_words(share, seconds, "--executor async runs 16 at once")
