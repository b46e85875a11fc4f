"""Result objects: intervals carry the level they were built at, and ``from_dict`` reads back
exactly what ``to_dict`` wrote (and what earlier versions stored, without per-interval levels)."""

from __future__ import annotations

import json

import pytest

import car_core as car
from car_core.results import ContrastiveResult, ShapleyResult
from car_core.stats import look_levels, looks
from car_core.testing import synthetic as syn


def test_interval_reads_as_the_pair_it_replaces() -> None:
    ci = car.Interval(0.1, 0.4, 0.95)
    low, high = ci
    assert (low, high) == (0.1, 0.4) and ci[0] == 0.1 and ci[1] == 0.4 and len(ci) == 2
    assert ci == (0.1, 0.4) and ci == [0.1, 0.4] and ci.level == 0.95
    assert ci != car.Interval(0.1, 0.4, 0.9)  # same bounds, another level: not the same
    assert ci != (0.1, 0.5)


def test_each_rescue_interval_has_the_level_of_the_look_that_decided_it() -> None:
    model = syn.pivot()
    run = model.failing_run(0)
    k = 32
    cap = len(run.steps) * k // (len(run.steps) + 1)  # full mode: n + 1 arms share n·K
    res = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=k,
                          search="full", seed=0)
    sizes = looks(cap)
    levels = look_levels(sizes, res.alpha, len(run.steps))
    tested = [s for s in res.steps if s.tested]
    assert tested and res.level == levels[-1]
    for s in tested:  # no branch failed, so a step's n is the size of the look that stopped it
        assert s.ci is not None and s.ci.level == levels[sizes.index(s.n)], s
    # steps after the pivot show no rescue and stop for futility before the last look
    assert any(s.n < cap and s.ci is not None and s.ci.level > res.level for s in tested)


@pytest.fixture(scope="module")
def results() -> tuple[ContrastiveResult, ShapleyResult]:
    model = syn.pivot()
    run = model.failing_run(1)
    return (car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=16, seed=1),
            car.shapley(run, model.agent(), outcome=model.outcome, budget=200, seed=1))


def test_from_dict_inverts_to_dict(results) -> None:
    con, sh = results
    for res, cls in ((con, ContrastiveResult), (sh, ShapleyResult)):
        back = cls.from_dict(json.loads(res.to_json()))
        assert back == res
        assert back.to_dict() == res.to_dict()


def test_results_stored_before_intervals_had_levels_still_load(results) -> None:
    con, sh = results
    old = json.loads(con.to_json())
    for row in old["steps"] + old["arms"]:
        del row["ci_level"]
    back = ContrastiveResult.from_dict(old)
    assert [s.ci and tuple(s.ci) for s in back.steps] == [s.ci and tuple(s.ci) for s in con.steps]
    assert all(s.ci.level == con.level for s in back.steps if s.ci is not None)
    old = json.loads(sh.to_json())
    for row in old["values"] + [old["v_full"], old["v_empty"]]:
        del row["ci_level"]
    back_sh = ShapleyResult.from_dict(old)
    assert [v.ci and tuple(v.ci) for v in back_sh.values] == [v.ci and tuple(v.ci)
                                                             for v in sh.values]
    assert back_sh.v_full.ci is not None and back_sh.v_full.ci.level == sh.level


def test_outcome_distribution_interval_has_its_level() -> None:
    model = syn.pivot()
    run = model.failing_run(0)
    dist = car.intervene(run, model.agent(), car.do_resample(2), outcome=model.outcome,
                         rollouts=8, level=0.9)
    assert dist.ci.level == 0.9 and dist.ci[0] <= dist.mean <= dist.ci[1]
    assert dist.to_dict()["ci"] == [dist.ci.low, dist.ci.high]


def test_result_from_dict_types_by_method_and_refuses_damage(results) -> None:
    from car_core.errors import InvalidInput
    from car_core.results import result_from_dict
    con, sh = results
    assert result_from_dict(con.to_dict()) == con and result_from_dict(sh.to_dict()) == sh
    damaged = con.to_dict()
    del damaged["steps"][0]["step"]
    with pytest.raises(InvalidInput, match="malformed"):
        result_from_dict(damaged)
    with pytest.raises(InvalidInput, match="not a CAR result"):
        result_from_dict({"method": "other"})
