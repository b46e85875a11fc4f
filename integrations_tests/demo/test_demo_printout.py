"""The demo's do(·) checks read like the table above them, and say why the first one's
P(fail) need not equal the table's re-drawn column (a new sample, with its own n)."""

from __future__ import annotations

import re

from car_adapters.demo import _checks

import car_core as car
from car_core import formatting as fmt
from car_core.testing import synthetic as syn


def test_the_checks_name_their_sample_beside_the_tables() -> None:
    model = syn.pivot()  # locus 2; P(fail | step 2 re-drawn) = 0.3
    run = model.failing_run(0)
    res = car.contrastive(run, model.agent(), outcome=model.outcome, rollouts=32, seed=0)
    again = car.intervene(run, model.agent(), car.do_resample(2), outcome=model.outcome,
                          rollouts=16, seed=1)
    held = car.intervene(run, model.agent(), car.do_action(2, run.steps[2].action),
                         outcome=model.outcome, rollouts=16, seed=1)
    text = _checks(res, 2, again, held)
    first, second, why = text.splitlines()
    assert first.endswith(fmt.failure_rate(again.mean, again.ci, again.level, again.n))
    assert second.endswith(fmt.failure_rate(held.mean, held.ci, held.level, held.n))
    _, redrawn, n = fmt.shown_sample(res.steps[2])
    assert f"{fmt.REDRAWN} {fmt.prob(redrawn)}" in why and f"own {n} pair(s)" in why
    assert f"seed {again.seed}" in why
    assert re.search(r"n=16\b", first) and "0.9500" not in text
