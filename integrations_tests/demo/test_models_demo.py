"""``run_demo`` end to end on the planted support model (seconds; the local-model run is the
same code with the embedded model and is timed by hand, see the README).

The planted model decides "refund" with probability 0.3 when it sees the injection and 0 when
it does not, at step 1 only; everything else is deterministic. So, analytically: the locus is
step 1, P(fail | do_resample(1)) = 0.3 and P(fail | step 1 without the injection) = 0.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from car_adapters.demo import run_demo
from car_adapters.demo.support_agent import outcome

import car_core as car
from car_core.errors import InvalidInput

ROLLOUTS = 32
# P(fail | do_resample(1)) is a mean of 32 Bernoulli(0.3) draws: standard error
# sqrt(0.3 * 0.7 / 32) = 0.081; four standard errors is the tolerance (seeds are fixed).
TOL = 4 * math.sqrt(0.3 * 0.7 / ROLLOUTS)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    folder = tmp_path_factory.mktemp("demo")
    result = run_demo(policy="synthetic", store=str(folder / "car.db"),
                      report=str(folder / "report.html"), rollouts=ROLLOUTS, progress=False)
    return result, folder


def test_demo_finds_the_planted_decision_step(demo: tuple[dict, Path]) -> None:
    result, _ = demo
    assert result["locus"] == 1 and result["decision_step"] == 1


def test_demo_measures_resampling_and_removing_the_injection(demo: tuple[dict, Path]) -> None:
    result, _ = demo
    assert abs(result["resampled"] - 0.3) <= TOL
    assert result["rescued"] == 0.0  # p_base = 0: no rollout can fail without the injection


def test_demo_stores_the_run_and_writes_the_report(demo: tuple[dict, Path]) -> None:
    result, folder = demo
    store = car.RunStore(folder / "car.db")
    try:
        run = store.load(result["run_id"])
        assert outcome(run)  # the stored run is the failing ticket
        # every ticket is stored with its score, so `car runs` tells which one failed
        tickets = [store.load(row["id"]) for row in store.runs()]
        scored = {r.id: r.outcome.value for r in tickets if r.outcome is not None}
        assert scored[run.id] == 1.0 and len(scored) == len(tickets)
        assert sorted(scored.values())[:-1] == [0.0] * (len(scored) - 1)
        assert store.attribution(result["attribution_id"]) is not None
    finally:
        store.close()
    html = (folder / "report.html").read_text(encoding="utf-8")
    assert result["run_id"] in html


def test_demo_rejects_an_unknown_policy(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="policy"):
        run_demo(policy="gpt-5", store=str(tmp_path / "car.db"), report=None)
