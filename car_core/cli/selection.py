"""Which stored runs a population command works on (``car triage``, ``car fix --failed``):
run ids, or the filters over the store, read without writing; the line it prints per run;
how such a command ends when its total budget ran out or it was stopped (Ctrl-C); and how
its stored result is exported (``car export triage|fix``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from car_core.cli import kit
from car_core.cli.app import STDOUT, ending, err, out, say
from car_core.engine.progress import Paced, PacedPrinter
from car_core.errors import AttributionNotFound, InvalidInput


class Format(StrEnum):
    json = "json"
    csv = "csv"


def when(text: str | None, flag: str) -> float | None:
    """Epoch seconds from ``--since``/``--until``: a number, or an ISO date or date-time
    (UTC unless it names its zone)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"{flag} {text!r} is neither a date nor epoch seconds",
                           hint=f"e.g. {flag} 2025-01-31 or {flag} 2025-01-31T12:00") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def selected(store: str, run_ids: list[str] | None, resume: str | None, outcome: str, *,
             agent_name: str | None = None, since: str | None = None,
             until: str | None = None, test: str | None = None,
             session: str | None = None) -> list[str]:
    """The runs a population command works on: ``run_ids``, else the store's runs the filters
    and ``outcome`` select; resuming with neither, the resumed attribution's own runs. The
    store is opened read-only: a damaged one is refused untouched."""
    from car_core.store.triages import select_runs  # brings sqlite-utils: not for --help
    filters = (agent_name, since, until, test, session)
    reader = kit.existing_store(store)
    try:
        if resume is not None and not run_ids and all(f is None for f in filters):
            stored = reader.attribution(resume).params.get("runs")
            return [str(i) for i in stored] if isinstance(stored, list) else []
        chosen = select_runs(reader, ids=run_ids or None, agent=agent_name,
                             since=when(since, "--since"), until=when(until, "--until"),
                             test=test, outcome=outcome, session=session)
        if not chosen and agent_name is not None:
            _check_agent_name(reader, agent_name)
        if run_ids:
            _say_left_out(reader, [i for i in dict.fromkeys(run_ids) if i not in chosen],
                          outcome)
        return chosen
    finally:
        reader.close()


def _check_agent_name(reader: Any, agent_name: str) -> None:
    """Refuse an ``--agent-name`` no stored run has, naming those the store holds: a trial's
    triage printed "agent support" (the deciding agent) and ``--agent-name support`` matched
    nothing, the runs being stored as ``openai-agents:support`` (the adapter's name)."""
    names = sorted({str(r["agent"]) for r in reader.runs() if r.get("agent")})
    if agent_name not in names:
        raise InvalidInput(f"--agent-name {agent_name!r} is no stored run's agent; the "
                           f"store's: {', '.join(map(repr, names)) or 'none'}",
                           hint="pass one of those names, as `car runs` lists them")


def per_run_lines(line: Callable[..., str], at_once: int = 1,
                  untimed: Callable[..., bool] | None = None) -> Callable[..., None]:
    """The progress a population command hands its estimate: ``line(done, total, ...)`` per
    run on stderr, with the time so far and left (``Paced``, for ``at_once`` runs at a time),
    as ``progress=True`` prints."""
    return PacedPrinter(Paced(line, at_once=at_once, untimed=untimed),
                        lambda said: err.print(Text(kit.safe(said)), soft_wrap=True))


def stored_params(store: str, resume: str | None) -> dict[str, Any]:
    """The settings the population resumed (``--resume``) was stored with, for the flags left
    out to take them, as ``car attribute --resume`` does; none when not resuming or when the id
    names nothing stored yet. The store is opened read-only."""
    if resume is None:
        return {}
    reader = kit.existing_store(store)
    try:
        return dict(reader.attribution(resume).params)
    except AttributionNotFound:
        return {}
    finally:
        reader.close()


def _say_left_out(reader: Any, ids: list[str], outcome: str) -> None:
    """Runs named on the command line that the selection left out, said with why: a run that
    passed was dropped without a word, and the count that followed read as if it was all."""
    if not ids:
        return
    from car_core.store.triages import stored_failed
    rows = {r["id"]: r for r in reader.runs()}
    why: dict[str, list[str]] = {}
    for i in ids:
        failed = stored_failed(rows[i])
        reason = ("did not fail (its stored outcome)" if outcome == "failed" and not failed
                  else "failed (its stored outcome)" if outcome == "passed" and failed
                  else "the other filters exclude")
        why.setdefault(reason, []).append(i)
    for reason, group in why.items():
        err.print(Text(kit.safe(f"left out {len(group)} run(s) named: {reason}: "
                                f"{', '.join(group)}")), soft_wrap=True)


def stop_if_ran_out(truncated: bool, note: str | None, resume_id: str | None) -> None:
    """A population whose total budget ran out: say how to continue it, exit ``BUDGET``."""
    if truncated:
        err.print(Text(kit.safe(f"the total budget ran out ({note}); to continue: the same "
                                f"command with --resume {resume_id} and a larger budget")),
                  soft_wrap=True)
        raise typer.Exit(kit.BUDGET)


@contextmanager
def resumable_stop(store: str, what: str, ident: str, began: Callable[[], bool]
                   ) -> Iterator[None]:
    """A population stopped by something a resume can change (Ctrl-C, a model server down):
    the error line, then where what finished is kept and the command that resumes ``ident``
    (the runs in flight stopped before their next rollout, their branches kept) — once
    ``began()`` says its row was written, as ``car attribute`` does: before that there is
    nothing to resume."""
    try:
        yield
    except BaseException as exc:
        end = ending(exc, "the store failed")
        if end is None or not kit.resumable(exc):
            raise
        if not end.message:  # nobody is reading: end as quietly as `git log | head`
            raise typer.Exit(end.code) from None
        if not began():
            say(end.message)
            raise typer.Exit(end.code) from None
        say(kit.resume_below(end.message, exc))  # the resume is said once: the command below
        err.print(Text(kit.safe(f"what finished is kept in {store} ({what} {ident}). "
                                f"Resume with:\n  {kit.resume_command(ident)}")),
                  soft_wrap=True)
        raise typer.Exit(end.code) from None


def export(result: Any, fmt: Format | None, out_path: Path | None, what: str) -> None:
    """Write a stored population result (``to_csv``/``to_json``) to ``out_path`` or standard
    output: CSV when asked, or when ``out_path`` ends in ``.csv``, else JSON."""
    chosen = fmt or (Format.csv if out_path is not None and out_path.suffix.lower() == ".csv"
                     else Format.json)
    text = str(result.to_csv() if chosen is Format.csv else result.to_json(indent=2) + "\n")
    if out_path is None:
        STDOUT.write(text)
        return
    kit.write_out(out_path, text, "pass --out a writable file")
    out.print(Text(kit.safe(f"wrote {what} ({chosen.value}) to {out_path}")))
