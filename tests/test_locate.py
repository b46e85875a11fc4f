"""The probabilistic bisection on unshared noise (``Navigator.locate``): its posterior over the
locus and the arm it runs next."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from car_core.estimators.navigation import Navigator, locus_posterior


class Table:
    """Arms with fixed outcomes by rollout index; records what was drawn."""

    def __init__(self, ys: dict[int, list[float]]) -> None:
        self.ys = {a: np.asarray(y, dtype=float) for a, y in ys.items()}
        self.drawn: list[tuple[int, int]] = []

    def outcomes(self, arm: int, indices: Sequence[int]) -> np.ndarray:
        idx = [i for i in indices if i < self.ys[arm].size]
        self.drawn += [(arm, i) for i in idx]
        return self.ys[arm][idx]

    def diffs(self, hi: int, lo: int, indices: Sequence[int]) -> np.ndarray:
        raise AssertionError("locate never pairs arms")

    def means(self, hi: int, lo: int, indices: Sequence[int]) -> tuple[float, float]:
        raise AssertionError("locate never pairs arms")

    @property
    def remaining(self) -> int:
        return 1000


def test_the_batched_posterior_is_the_posterior_of_each_row():
    """``locus_posterior`` takes what-ifs on leading axes (the look-ahead asks for two per
    arm at once): each row must be exactly the posterior computed on that row alone."""
    rng = np.random.default_rng(7)
    runs = rng.integers(0, 20, size=(6, 9)).astype(float)
    fails = np.floor(runs * rng.random((6, 9)))
    batched = locus_posterior(fails, runs, 0, 8)
    for row in range(6):
        alone = locus_posterior(fails[row], runs[row], 0, 8)
        assert batched[row] == pytest.approx(alone, abs=1e-12)
        assert alone.sum() == pytest.approx(1.0)
    # a rise between arm 3 and arm 4 that every arm shows clearly puts the locus at 3
    clear = locus_posterior(np.array([2, 2, 2, 2, 20, 20, 20, 20, 20.0]), np.full(9, 20.0), 0, 8)
    assert int(np.argmax(clear)) == 3 and clear[3] > 0.99


def test_an_arm_run_many_times_is_not_run_again_while_an_unrun_arm_splits_the_locus():
    """Four steps; arm 2 ran 32 times (29 failures), H_0 and H_4 from the gate, arms 1 and 3
    never. The locus is split 0.41 : 0.59 on either side of arm 2, which made it the arm to
    run under the rule this replaced (value an arm by how evenly the locus splits around it);
    but what arm 2 would add is little beside 32 outcomes, while arm 1 (step 0 or 1 against
    2 or 3) and arm 3 (step 2 against 3) have shown nothing: looking ahead on the posterior
    runs one of them."""
    ys = {0: [1, 1, 1, 1, 1, 0], 1: [1.0] * 8, 2: [1.0] * 29 + [0.0] * 3, 3: [1.0] * 8,
          4: [1.0] * 13}
    nav = Navigator(Table(ys), 4, 128)
    nav.reach = {0: 6, 2: 32, 4: 13}
    post = nav.posterior(0, 4)
    assert post[2] == pytest.approx(post[3]) and post[2] == max(post)
    assert post[:2].sum() == pytest.approx(0.41, abs=0.01)
    assert nav._most_telling(0, 4, post) in (1, 3)


def test_the_bets_go_to_the_largest_only_where_every_arm_after_the_candidate_always_failed():
    """``certain_after(c)``: every rollout of the arms after ``c`` failed, at least
    ``CERTAIN_SEEN`` of them, so the confirmation's pairs are not expected to go down. One
    pass after ``c`` (a judge that errs) or too few rollouts to tell leaves the usual bets."""
    from car_core.estimators.navigation import CERTAIN_SEEN
    ys = {0: [1, 0, 1, 1], 1: [1, 0, 1, 1], 2: [0, 1, 1, 1, 0, 1], 3: [1.0] * 6, 4: [1.0] * 4}
    nav = Navigator(Table(ys), 4, 128)
    nav.reach = {0: 4, 1: 4, 2: 6, 3: 6, 4: 4}
    assert 6 + 4 >= CERTAIN_SEEN and nav.certain_after(2)
    assert not nav.certain_after(1)               # arm 2 passed twice
    nav.reach = {0: 4, 2: 6, 3: 3, 4: 4}          # 7 rollouts after step 2: too few to tell
    assert not nav.certain_after(2)
    ys[3] = [1.0] * 5 + [0.0]
    nav = Navigator(Table(ys), 4, 128)
    nav.reach = {0: 4, 1: 4, 2: 6, 3: 6, 4: 4}
    assert not nav.certain_after(2)
