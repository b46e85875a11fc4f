"""How the ``car`` command ends when what is around it ends first: a reader that closes the
pipe early (``car show RUN | head -1``) and user code that calls ``sys.exit``, each named as
what it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from car_core.cli import kit
from car_core.model.trajectory import Step, Trajectory
from car_core.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
PIVOT = "car_core.synthetic:pivot"
ENV = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(ROOT)}


def long_run(folder: Path) -> Trajectory:
    """A run whose `car show` prints far more than a pipe holds (64 KiB on Linux): the
    command is still writing when its reader goes away."""
    steps = [Step(i, "a" * 100, "o" * 100, True) for i in range(2000)]
    run = Trajectory.new(context="ctx", steps=steps)
    with RunStore(folder / "car.db") as s:
        s.save(run)
    return run


@pytest.mark.parametrize("extra", [[], ["--full"]])
def test_a_reader_that_closes_the_pipe_ends_car_quietly(tmp_path, extra):
    """`car show RUN | head -1`: the first line arrives, then the command ends as git does
    when its reader goes away (141, nothing on stderr), never as the agent's sys.exit(1)."""
    run = long_run(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "car_core.cli", "show", run.id, *extra],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline().decode()
    proc.stdout.close()  # what `head -1` does after its line
    stderr = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert first.startswith(f"run {run.id}")
    assert code == kit.CLOSED_PIPE == 141, stderr
    assert stderr == ""  # no error line, no "Exception ignored", no traceback


EXITING = '''
import sys
import car_core.testing.synthetic as syn

def agent_exits():
    agent = syn.pivot().agent()
    def policy(history, rng):
        sys.exit(3)
    agent.policy = policy
    return agent

def outcome_exits(run):
    sys.exit(3)

def outcome_exits_with_rng(run, rng):
    sys.exit(3)

async def outcome_exits_async(run):
    sys.exit(3)

outcome = syn.pivot().outcome
'''


@pytest.mark.parametrize(("agent", "outcome", "who"), [
    ("exiting:agent_exits", "exiting:outcome", "the agent's code"),
    (PIVOT, "exiting:outcome_exits", "the outcome function"),
    (PIVOT, "exiting:outcome_exits_with_rng", "the outcome function"),
    (PIVOT, "exiting:outcome_exits_async", "the outcome function")])
def test_a_sys_exit_in_user_code_is_named_as_whose_it_is(tmp_path, pivot_run, agent, outcome,
                                                          who):
    with RunStore(tmp_path / "car.db") as s:
        s.save(pivot_run)
    (tmp_path / "exiting.py").write_text(EXITING)
    for command in (["attribute", pivot_run.id, "--rollouts", "4"],
                    ["intervene", pivot_run.id, "--do", "resample:2", "--rollouts", "4"]):
        proc = subprocess.run([sys.executable, "-m", "car_core.cli", *command, "--agent", agent,
                               "--outcome", outcome], cwd=tmp_path, env=ENV,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == kit.AGENT, (command, proc.stderr)
        assert f"car: error: {who} called sys.exit(3) instead of returning" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_the_named_outcome_keeps_its_arity_and_settled_hook():
    """The wrapper that names an outcome's sys.exit is what CAR calls: it must take the
    same arguments and offer the same ``settled``."""
    def one(run):
        return 1.0

    def two(run, rng):
        return 0.0

    one.settled = lambda run: True  # type: ignore[attr-defined]
    from car_core.model.outcome import OutcomeFn
    wrapped_one = OutcomeFn(kit._naming_exits(one, "the outcome function"))
    wrapped_two = OutcomeFn(kit._naming_exits(two, "the outcome function"))
    assert not wrapped_one.takes_rng and wrapped_two.takes_rng
    assert wrapped_one.settles and not wrapped_two.settles


def test_the_named_outcome_stays_async():
    """An ``async def`` outcome named for the CLI is still one: awaited on the executor's
    loop, not sent to a worker thread, and scoring what the outcome returns."""
    from car_core.model.outcome import OutcomeFn

    async def judge(run, rng):
        return 0.25

    wrapped = OutcomeFn(kit._naming_exits(judge, "the outcome function"))
    assert wrapped.is_async and wrapped.takes_rng
    assert wrapped(Trajectory.new(context="x", steps=[]), None) == 0.25
