"""The failing tests of a ``--car-attribute`` session as one population: the end-of-session
section that groups where they commit, and the session id that lets ``car triage`` select them.

Ground truth. Two planted failure modes (``synthetic.pivot(n_steps=4, at=AT, p_bad=0.3)``):
``N1`` tests fail at step 1 and ``N2`` at step 2, each with rescue 0.7 on a deterministic
outcome, so with 16 rollouts per arm (256 at most) each test's locus confirms at its planted
step (as in ``test_pytest_plugin_ci.py``) and each group's tests are asserted exactly. One more
failing test records no failed run: it failed on something else, and must be listed apart, out
of the shares (it was counted undecided). A failing test that never used ``car_recorder`` is
not part of the population. The shares are then exact (N1 of N, N2 of N); the check on the
intervals is that each covers its planted share and is no wider than a Wilson interval at the
printed level allows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from car_core.store import RunStore
from car_core.store.triages import select_runs
from integrations_tests.support.plugin_runs import session_store

pytestmark = pytest.mark.slow

N1, N2 = 3, 2
N = N1 + N2  # the test whose run passed is left out

MODE = '''
from car_core.testing import synthetic


def test_at{at}_{i}(car_recorder):
    scm = synthetic.pivot(n_steps=4, at={at}, p_bad=0.3, name="pivot{at}")
    car_recorder.watch(scm.agent(), outcome=scm.outcome)
    assert not scm.failing_run(seed={i}).failed
'''
NOT_ATTRIBUTED = '''
import car_core as car
from car_core.testing import synthetic


def test_recorded_but_passed_run(car_recorder):
    scm = synthetic.pivot(n_steps=4, at=1, p_bad=0.3)
    car_recorder.watch(scm.agent(), outcome=scm.outcome)
    run = car.record(scm.agent(), context={"scm": scm.name}, outcome=scm.outcome, seed=0)
    assert run.failed


def test_no_recorder():
    assert 1 + 1 == 3
'''


def _suite(pytester: pytest.Pytester) -> None:
    for at, count in ((1, N1), (2, N2)):
        for i in range(count):
            pytester.makepyfile(**{f"test_at{at}_{i}": MODE.format(at=at, i=i)})
    pytester.makepyfile(test_other=NOT_ATTRIBUTED)


def _section(out: str) -> str:
    start = out.index("CAR: where the failing tests commit")
    return out[start:out.index("short test summary info")]


def _pct(text: str) -> float:
    return float(text.rstrip("%")) / 100


@pytest.mark.parametrize("xdist", [False, True], ids=["serial", "xdist"])
def test_the_session_summary_groups_the_failing_tests_by_where_they_commit(
        pytester: pytest.Pytester, xdist: bool) -> None:
    _suite(pytester)
    args = ["--car-attribute", "--car-rollouts", "16", "--tb=no"]
    result = pytester.runpytest_subprocess(*args, *(["-n", "2"] if xdist else []))
    result.assert_outcomes(failed=N + 2)
    text = _section(result.stdout.str())
    # the answer first, in plain words
    head = re.search(rf"{N1} of {N} failing tests commit at step 1 \((\d+)%; (\d+)% to (\d+)% "
                     r"with 95% confidence for every share at once\)", text)
    assert head, text
    assert _pct(head[1] + "%") == pytest.approx(N1 / N, abs=0.005)
    for at, count in ((1, N1), (2, N2)):
        row = re.search(rf"  step {at}: {count} test\(s\), (\d+)% \[(\d+)%, (\d+)%\]\n"
                        r"((?:      \S+\n)+)", text)
        assert row, text
        share, lo, hi = (_pct(row[k] + "%") for k in (1, 2, 3))
        # rounded to whole percent: each bound may be off by half a point
        assert lo - 0.005 <= count / N <= hi + 0.005 and hi - lo < 0.9
        assert sorted(row[4].split()) == [f"test_at{at}_{i}.py::test_at{at}_{i}"
                                          for i in range(count)]
    assert "undecided" not in text
    apart = re.search(r"  left out: 1 failing test\(s\) whose recorded runs all passed \(the "
                      r"test failed on something else\)\n      (\S+)\n", text)
    assert apart and apart[1] == "test_other.py::test_recorded_but_passed_run", text
    assert "test_no_recorder" not in text
    # the session's id, which selects exactly the failed runs the attributions explained
    session = re.search(r"--session (\S+) --agent", text)
    assert session, text
    with RunStore(session_store(pytester), readonly=True) as store:
        chosen = select_runs(store, session=session[1])
        tests = {r["id"]: r["test"] for r in store.runs()}
    assert sorted(tests[i] for i in chosen) == sorted(
        [f"test_at{at}_{i}.py::test_at{at}_{i}" for at, c in ((1, N1), (2, N2))
         for i in range(c)])


def test_a_store_kept_across_sessions_tells_them_apart(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(**{f"test_at1_{i}": MODE.format(at=1, i=i) for i in range(2)})
    store = pytester.path / "kept.db"
    ids = []
    for _ in range(2):
        result = pytester.runpytest("--car-attribute", "--car-rollouts", "16", "--tb=no",
                                    f"--car-store={store}")
        result.assert_outcomes(failed=2)
        out = result.stdout.str()
        assert "CAR: where the failing tests commit" in out
        assert "2 of 2 failing tests commit at step 1" in out
        ids.append(re.search(r"--session (\S+) --agent", out)[1])
    assert ids[0] != ids[1]
    with RunStore(Path(store), readonly=True) as db:
        first, second = (select_runs(db, session=s) for s in ids)
        every = select_runs(db)
    assert len(first) == len(second) == 2 and not set(first) & set(second)
    assert sorted(every) == sorted(first + second)


def test_one_failing_test_gets_no_population_section(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_at1_0=MODE.format(at=1, i=0))
    result = pytester.runpytest("--car-attribute", "--car-rollouts", "16", "--tb=no")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "CAR attribution summary" in out and "failing tests commit" not in out
