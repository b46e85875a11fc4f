"""The hint after a slow estimate that CAR ran one branch at a time while the process mostly
waited (a model server CAR took for an in-process model): said only then."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import car_core as car
from car_core.cli.kit import waiting_hint
from car_core.engine import execution
from car_core.engine.execution import (
    WAIT_HINT_CPU,
    WAIT_HINT_SECONDS,
    AsyncioExecutor,
    Sequential,
    WaitedOneAtATime,
)

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))


def test_said_when_car_chose_one_at_a_time_and_the_process_waited() -> None:
    said = waiting_hint(Sequential(), None, 80.0, 4.0)
    assert said is not None and "(5% of 80s on the CPU)" in said
    assert "--executor async" in said and "remote=True" in said


def test_not_said_when_the_user_chose_or_car_ran_them_at_once_or_it_computed() -> None:
    assert waiting_hint(Sequential(), Sequential(), 80.0, 4.0) is None  # the user's choice
    assert waiting_hint(AsyncioExecutor(), None, 80.0, 4.0) is None  # already at once
    assert waiting_hint(Sequential(), None, 80.0, 80.0 * WAIT_HINT_CPU) is None  # computing
    assert waiting_hint(Sequential(), None, WAIT_HINT_SECONDS - 1, 0.0) is None  # short


SLOW = '''
import time
from car_core.testing import synthetic as syn

M = syn.pivot()


def policy(history, rng):
    time.sleep(0.03)  # a model server's wait, which CAR cannot tell from in-process work
    return M.policy(history, rng)


def make():
    import car_core as car
    return car.FunctionAgent(policy=policy, environment=M.environment,
                             is_final=lambda a: bool(a.get("final")), max_steps=M.n_steps,
                             name="synthetic:pivot")


def outcome(run, rng):
    return M.outcome(run, rng)
'''


def _slow_store(tmp_path: Path, monkeypatch: Any) -> str:
    """A store holding the slow agent's failing run, in a folder the CLI imports ``slow``
    from, with the hint's threshold lowered so the tests stay short; the run's id."""
    from car_core.store import RunStore

    (tmp_path / "slow.py").write_text(SLOW, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(execution, "WAIT_HINT_SECONDS", 0.5)
    import slow
    with RunStore(tmp_path / "car.db") as store:
        store.save(slow.M.failing_run(0))
        return str(store.runs()[0]["id"])


def test_the_cli_says_it_after_a_slow_sequential_attribution(tmp_path: Path,
                                                              monkeypatch) -> None:
    """Through ``car attribute`` (in this process, the threshold lowered so the test stays
    short): an agent that sleeps in its policy, as one waiting on a model server does."""
    from cli_golden import _car
    run_id = _slow_store(tmp_path, monkeypatch)
    code, _, err = _car("attribute", run_id, "--agent", "slow:make", "--outcome",
                        "slow:outcome", "--rollouts", "8", "--store", "car.db")
    assert code in (0, 1), err
    assert "the branches ran one at a time and the process mostly waited" in err
    # named by the user: no hint
    code, _, err = _car("attribute", run_id, "--agent", "slow:make", "--outcome",
                        "slow:outcome", "--rollouts", "2", "--store", "car.db",
                        "--executor", "sequential")
    assert code in (0, 1, 3), err  # 3: undecided at this budget
    assert "mostly waited" not in err


def test_car_fix_on_a_population_says_it_too_and_takes_executor(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """``car fix --failed`` ran its runs' branches one at a time with no hint (a user trial's
    custom model slept 60 of 86 s) and had no ``--executor``: it now says so as ``car
    attribute`` does, and ``--executor async`` is taken (the hint is then not said)."""
    from cli_golden import _car
    _slow_store(tmp_path, monkeypatch)
    fix = ("fix", "--failed", "--agent", "slow:make", "--outcome", "slow:outcome",
           "--instruction", "check twice", "--rollouts", "4", "--from-step", "0",
           "--store", "car.db")
    code, _, err = _car(*fix)
    assert code in (0, 1, 6), err
    assert "the branches ran one at a time and the process mostly waited" in err
    code, _, err = _car(*fix, "--executor", "async", "--concurrency", "4")
    assert code in (0, 1, 6), err
    assert "mostly waited" not in err


def test_car_triage_says_it_too(tmp_path: Path, monkeypatch) -> None:
    """A first-hour trial's ``car triage`` over a model server waited 135 s of its 142 s one
    branch at a time with no word: it says so as ``car attribute`` does."""
    from cli_golden import _car
    _slow_store(tmp_path, monkeypatch)
    triage = ("triage", "--agent", "slow:make", "--outcome", "slow:outcome",
              "--rollouts", "8", "--store", "car.db")
    code, _, err = _car(*triage)
    assert code in (0, 1, 3), err
    assert "the branches ran one at a time and the process mostly waited" in err
    code, _, err = _car(*triage, "--executor", "sequential")
    assert code in (0, 1, 3), err
    assert "mostly waited" not in err


def test_car_intervene_takes_executor_and_says_it_too(tmp_path: Path, monkeypatch) -> None:
    """``car intervene`` had no ``--executor`` at all (first-hour trial: 58 s for 64
    rollouts one at a time)."""
    from cli_golden import _car
    run_id = _slow_store(tmp_path, monkeypatch)
    base = ("intervene", run_id, "--agent", "slow:make", "--outcome", "slow:outcome",
            "--do", "resample:0", "--rollouts", "24", "--store", "car.db")
    code, _, err = _car(*base)
    assert code == 0, err
    assert "the branches ran one at a time and the process mostly waited" in err
    code, out, err = _car(*base, "--executor", "async", "--concurrency", "8")
    assert code == 0 and "mostly waited" not in err and "P(fail)" in out, err


def test_an_estimate_from_python_warns_of_it_too(tmp_path: Path, monkeypatch) -> None:
    """From Python nothing said so: a trial's seed-ignoring hosted model ran out of budget in
    four of five estimates at 26 s each, where ``executor="async"`` answered in 9 s. Not said
    where the caller chose the executor."""
    _slow_store(tmp_path, monkeypatch)
    import slow
    run = slow.M.failing_run(0)
    with pytest.warns(WaitedOneAtATime, match='pass executor="async" to run 16 at once') as w:
        car.contrastive(run, slow.make(), outcome=slow.outcome, rollouts=4, progress=False)
    # a failing test shows the warning too: a trial read the keyword where the flag applies
    assert "(in the pytest plugin, --car-executor async)" in str(w[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WaitedOneAtATime)
        car.contrastive(run, slow.make(), outcome=slow.outcome, rollouts=4, progress=False,
                        executor="sequential")
