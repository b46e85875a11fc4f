"""Repairs ranked against planted rescue rates, and the pairs exported from them."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import car_core as car
from car_core.errors import InvalidInput
from car_core.estimators.pairs import SCHEMA, read_pairs
from car_core.model.trajectory import History
from car_core.testing.synthetic_context import injected, poisoned_tool

ALPHA = 0.05
WORLD = injected(10)  # unrepaired P(fail) = p_hi = 0.9; without the injected message 0.1


def fixed(q: float) -> Callable[[History, np.random.Generator], str]:
    """A policy for the step that fails with probability ``q``: a planted rescue rate."""
    def policy(history: History, rng: np.random.Generator) -> str:
        return "bad" if float(rng.random()) < q else "good"
    policy.__name__ = f"fails {q:.0%}"
    return policy


def _planted(run: car.Trajectory, qs: tuple[float, ...]) -> tuple[list[Any], dict[str, float]]:
    cands: list[Any] = [(f"q={q}", car.do_policy(0, fixed(q))) for q in qs]
    cands.append(car.remove_sources(0, [car.context_sources(run, 0)[3]]))
    truth = {f"q={q}": q for q in qs}
    truth["remove user message 3"] = WORLD.p_lo
    return cands, truth


def test_repairs_are_ranked_by_planted_rates_with_simultaneous_coverage() -> None:
    # 100 seeds. Ranking: rates 0.1 (twice), 0.4, 0.7 are ≥ 0.3 apart; at 64 rollouts an arm's
    # sd is ≤ 0.0625, so a swap needs a 0.3 gap closed by ≥ 3.4 sd of the difference: it
    # should essentially never happen (measured: 100 of 100). Coverage: the intervals are
    # built to hold together with ≥ 1 − α; measured 0.99; asserted ≥ 1 − α over the seeds.
    seeds, ordered, covered = 100, 0, 0
    for seed in range(seeds):
        run = WORLD.failing_run(seed)
        cands, truth = _planted(run, (0.7, 0.4, 0.1))
        result = car.repairs(run, WORLD.agent(), step=0, candidates=cands,
                             outcome=WORLD.outcome, rollouts=64, alpha=ALPHA, seed=seed)
        assert result.rollouts_used <= 64 * (len(cands) + 1)
        labels = [r.candidate.label for r in result.ranked]
        ordered += (set(labels[:2]) == {"q=0.1", "remove user message 3"}
                    and labels[2:] == ["q=0.4", "q=0.7"])
        u = result.unrepaired
        covered += (u.ci[0] <= WORLD.p_hi <= u.ci[1]
                    and all(r.ci[0] <= truth[r.candidate.label] <= r.ci[1]
                            for r in result.ranked))
    assert ordered >= 0.95 * seeds
    assert covered >= (1 - ALPHA) * seeds


def test_a_clear_best_stops_the_ranking_early_and_is_named() -> None:
    run = WORLD.failing_run(0)
    result = car.repairs(run, WORLD.agent(), step=0, outcome=WORLD.outcome, rollouts=64,
                         candidates=[("q=0.02", car.do_policy(0, fixed(0.02))),
                                     ("q=0.8", car.do_policy(0, fixed(0.8))),
                                     ("q=0.95", car.do_policy(0, fixed(0.95)))])
    assert result.stopped_early and result.best is not None
    assert result.best.candidate.label == "q=0.02" and result.best.validated
    assert result.rollouts_used < 64 * 4
    assert all(r.dropped_at is not None for r in result.ranked if r is not result.best)


def test_a_guard_on_a_poisoned_tool_result_rescues() -> None:
    world = poisoned_tool(6)
    run = world.failing_run(0)
    guard = car.guard_observation(0, "Lookup: order found, refund window closed.")
    result = car.repairs(run, world.agent(), step=1, candidates=[guard],
                         outcome=world.outcome, rollouts=32, seed=0)
    assert result.ranked[0].validated
    assert result.ranked[0].p_fail <= 0.35  # planted 0.1; the 32-rollout upper end is ≈ 0.25


def test_an_instruction_is_added_after_the_system_messages() -> None:
    edit = car.add_instruction(0, "never refund without a receipt").interventions[0]
    assert isinstance(edit, car.Intervention.__args__[3])  # type: ignore[attr-defined]
    messages = [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]
    assert edit.edit is not None
    assert [m["content"] for m in edit.edit(messages)] == ["a", "never refund without a receipt",
                                                          "b"]


def test_a_propose_hook_adds_candidates() -> None:
    run = WORLD.failing_run(0)
    seen: list[Any] = []

    def propose(r: car.Trajectory, step: int, state: Any) -> list[Any]:
        seen.append(state)
        return [("proposed", car.do_policy(0, fixed(0.0)))]

    result = car.repairs(run, WORLD.agent(), step=0, candidates=[], propose=propose,
                         outcome=WORLD.outcome, rollouts=16)
    assert isinstance(seen[0], History) and result.ranked[0].candidate.label == "proposed"


def test_no_candidate_and_a_repair_before_the_step_are_refused() -> None:
    run = WORLD.failing_run(0)
    with pytest.raises(InvalidInput, match="no candidate"):
        car.repairs(run, WORLD.agent(), step=0, candidates=[], outcome=WORLD.outcome)
    tool = poisoned_tool(4)
    with pytest.raises(InvalidInput, match="before"):
        car.repairs(tool.failing_run(0), tool.agent(), step=1, outcome=tool.outcome,
                    candidates=[car.do_resample(0)])


def test_pairs_export_one_validated_line_per_repair_with_the_schema() -> None:
    run = WORLD.failing_run(0)
    cands, _ = _planted(run, (0.9,))
    result = car.repairs(run, WORLD.agent(), step=0, candidates=cands, outcome=WORLD.outcome,
                         rollouts=64, seed=0)
    buf = io.StringIO()
    written = car.export_pairs([(run, result)], buf)
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert written == len(lines) == 1  # q=0.9 does not rescue, so only the removal is written
    pair = lines[0]
    assert pair["schema"] == SCHEMA and pair["run_id"] == run.id and pair["step"] == 0
    assert pair["failing_action"] == "bad" and pair["rescue"]["action"] == "good"
    assert pair["rescue"]["kind"] == "remove source"
    assert pair["rescue_ci"][0] <= pair["rescue_estimate"] <= pair["rescue_ci"][1]
    assert pair["rescue_ci"][0] > 0 and pair["validated"]
    assert len(pair["state"]["context"]) == 10


def test_pairs_round_trip_through_a_file(tmp_path: Any) -> None:
    run = WORLD.failing_run(1)
    cands, _ = _planted(run, (0.1,))
    result = car.repairs(run, WORLD.agent(), step=0, candidates=cands, outcome=WORLD.outcome,
                         rollouts=32, seed=1)
    path = tmp_path / "pairs.jsonl"
    n = car.export_pairs([(run, result)], path, validated_only=False)
    assert [p["rescue"]["label"] for p in read_pairs(path)] == [
        r.candidate.label for r in result.ranked][:n]
    path.write_text('{"schema": "other"}\n')
    with pytest.raises(InvalidInput, match="car.pair/1"):
        read_pairs(path)
