"""The pytest plugin with an outcome that cannot see the recorded failure: the attribution is
refused in one line naming ``OutcomeMismatch`` (both scores shown), before any branch runs and
without writing an attribution, where it used to print a confident "no cause".

The planted agent is ``synthetic.pivot(n_steps=4, at=1, p_bad=0.3)``, recorded with its own
outcome (so its failing run is stored with outcome 1.0); the test watches it with an outcome
that reads a field the run does not have, so it scores every run 0.
"""

from __future__ import annotations

import pytest

from car_core.store import RunStore
from integrations_tests.support.plugin_runs import section, session_store

BLIND_SUITE = '''
import car_core as car
from car_core.testing import synthetic

SCM = synthetic.pivot(n_steps=4, at=1, p_bad=0.3)


def blind(run):
    """The app's rule applied to something the run does not hold: always 'fine'."""
    return bool((run.meta or {}).get("refunded"))


def counted_agent():
    agent = SCM.agent()

    def policy(history, rng):
        with open("policy_calls.log", "a") as f:
            f.write("call\\n")
        return SCM.policy(history, rng)

    agent.policy = policy
    return agent


def test_blind_outcome(car_recorder):
    agent = counted_agent()
    car_recorder.watch(agent, outcome=blind)
    run = next(r for r in (car.record(agent, context=None, outcome=SCM.outcome, seed=s)
                           for s in range(100)) if r.failed)
    with open("recorded.txt", "w") as f:
        f.write(str(len(open("policy_calls.log").read().splitlines())))
    assert not run.failed
'''


def test_an_outcome_blind_to_the_recorded_failure_is_refused_before_any_branch(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_blind=BLIND_SUITE)
    rec = pytester.inline_run("--car-attribute", "--car-rollouts", "8", "test_blind.py")
    rec.assertoutcome(failed=1)  # the suite fails, as the test did: a non-zero exit
    text = section(rec.getreports("pytest_runtest_logreport"), "test_blind_outcome")
    assert text is not None and "\n" not in text, text
    assert text.startswith("not attributed: OutcomeMismatch: the outcome scores the recorded "
                           "run as fine (0.00, 0.00, 0.00 on 3 scores) but it is stored as "
                           "failed (1.00"), text
    assert "No cause" not in text and "no cause" not in text
    calls = (pytester.path / "policy_calls.log").read_text().splitlines()
    assert len(calls) == int((pytester.path / "recorded.txt").read_text())  # no branch ran
    with RunStore(session_store(pytester)) as store:
        assert store.attribution_ids() == []  # nothing begun, nothing to resume
