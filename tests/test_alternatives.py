"""What the agent did instead: the re-drawn actions at a tested step, grouped, with their share
of the branches and the failure rate of each, checked against a planted world whose deciding
step picks known actions with known probabilities and known failure rates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import car_core as car
from car_core.errors import InvalidInput
from car_core.estimators.alternatives import (
    MAX_GROUPS,
    MIN_BRANCHES,
    OTHER,
    Choices,
    default_action_key,
)
from car_core.estimators.settings import ContrastiveSettings
from car_core.model.trajectory import Step, Trajectory
from car_core.report import render_attribution
from car_core.results import Alternative, ContrastiveResult, StepEffect
from car_core.testing.synthetic_choices import PlantedChoices

KEYS = ["action", "share", "share_ci", "p_fail", "p_fail_ci", "n"]
ALPHA = 0.005  # every interval at 99.5%: see the allowance in test_intervals_cover_...
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def world() -> PlantedChoices:
    return PlantedChoices()


@pytest.fixture(scope="module")
def results(world: PlantedChoices) -> dict[int, tuple[Trajectory, ContrastiveResult]]:
    out = {}
    for seed in SEEDS:
        run = world.failing_run(seed=seed * 1000)
        out[seed] = run, car.contrastive(run, world.agent(), outcome=world.judge, rollouts=64,
                                         alpha=ALPHA, seed=seed)
    return out


def _truth(world: PlantedChoices) -> dict[str, tuple[float, float]]:
    """The planted (share, P(fail)) of each choice, under its default key."""
    return {default_action_key(world.action_of(i, 0.3, 0.7)): (c[2], c[3])
            for i, c in enumerate(world.choices)}


def _traj(steps: list[Step]) -> Trajectory:
    return Trajectory.new(context=None, steps=steps)


def _locus_step(res: ContrastiveResult) -> StepEffect:
    assert res.locus is not None
    return res.steps[res.locus]


def test_intervals_cover_each_planted_share_and_failure_rate(world, results):
    # Each run checks at most 4 shares and 4 failure rates, each interval at 1 − ALPHA =
    # 99.5% on its own, so over the 3 seeds at most 24 intervals; the expected number of
    # misses is <= 24 · 0.005 = 0.12, and by Markov's inequality two or more misses happen
    # with probability <= 0.06 whatever the dependence between them: one miss is allowed.
    truth = _truth(world)
    misses, checked = [], 0
    for seed, (_run, res) in results.items():
        assert res.locus == world.at
        s = _locus_step(res)
        assert {a.action for a in s.alternatives} == set(truth)  # every group, nothing else
        for a in s.alternatives:
            share, p_fail = truth[a.action]
            checked += 1
            if not a.share_ci.low <= share <= a.share_ci.high:
                misses.append((seed, a.action, "share", share, a.share_ci))
            if a.p_fail is None:
                assert a.n < MIN_BRANCHES and a.p_fail_ci is None
                continue
            assert a.n >= MIN_BRANCHES
            checked += 1
            if not a.p_fail_ci.low <= p_fail <= a.p_fail_ci.high:
                misses.append((seed, a.action, "p_fail", p_fail, a.p_fail_ci))
    assert checked >= 18  # most groups are large enough to give their failure rate
    assert len(misses) <= 1, misses


def test_groups_are_read_from_the_arm_that_re_drew_the_step(world, results):
    for _run, res in results.values():
        s = _locus_step(res)
        arm = next(a for a in res.arms if a.hold_before == world.at)
        assert sum(a.n for a in s.alternatives) == arm.n  # every branch of H_at, once
        assert sum(a.share for a in s.alternatives) == pytest.approx(1.0)
        assert [a.n for a in s.alternatives] == sorted((a.n for a in s.alternatives),
                                                       reverse=True)
        assert all(a.share_ci.level == res.level for a in s.alternatives)
        # steps the estimate did not test list nothing
        assert all(not e.alternatives and e.recorded_action is None
                   for e in res.steps if not e.tested)


def test_the_recorded_action_is_marked(world, results):
    run, res = results[0]
    s = _locus_step(res)
    assert s.recorded_action == default_action_key(run.steps[world.at].action)
    assert s.recorded_action == 'book_fare({"fare":"business"})'
    assert 'book_fare({"fare":"business"}) (recorded)' in res.alternatives_text(world.at)


def test_print_shows_the_locus_and_explain_every_tested_step(world, results):
    _run, res = results[0]
    text = str(res)
    heading = f"What the agent did instead at step {world.at} ("
    assert text.count(heading) == 1
    assert text.index("<- locus") < text.index(heading) < text.index("rollouts used")
    assert "read_policy(" in text and "Which fare would you like?" in text
    explain = res.explain()
    tested = [s.step for s in res.steps if s.alternatives]
    assert all(f"What the agent did instead at step {k} (" in explain for k in tested)


def test_too_few_branches_give_no_failure_rate():
    choices = Choices(default_action_key)
    run = _traj(steps=[Step(index=0, action="a")])
    for action, value in [("a", 1.0)] * 6 + [("b", 0.0)] * 2:
        choices.add(0, _traj(steps=[Step(index=0, action=action)]), value)
    a, b = choices.alternatives(0, "a", 0.95)
    assert (a.action, a.n, a.p_fail, b.action, b.n, b.p_fail) == ("a", 6, 1.0, "b", 2, None)
    assert b.p_fail_ci is None and b.share == 0.25 and b.share_ci.low < 0.25 < b.share_ci.high
    res = _result_with(StepEffect(step=0, tested=True, alternatives=(a, b),
                                  recorded_action="a"), run)
    assert "too few to tell" in res.alternatives_text(0)


def test_a_recorded_action_never_re_drawn_still_has_its_row():
    choices = Choices(default_action_key)
    for _ in range(4):
        choices.add(0, _traj(steps=[Step(index=0, action="b")]), 0.0)
    rows = choices.alternatives(0, "a", 0.95)
    assert [(r.action, r.n, r.share) for r in rows] == [("b", 4, 1.0), ("a", 0, 0.0)]
    assert rows[1].share_ci.high > 0  # 0 of 4 does not say never


def test_many_groups_keep_the_most_taken_and_pool_the_rest():
    choices = Choices(default_action_key)
    for i in range(MAX_GROUPS + 5):
        for _ in range(i + 1):
            choices.add(0, _traj(steps=[Step(index=0, action=f"reply {i}")]), 1.0)
    rows = choices.alternatives(0, "reply 0", 0.95)
    assert len(rows) == MAX_GROUPS + 1  # the recorded, the MAX_GROUPS - 1 most taken, OTHER
    assert {"reply 0", OTHER} <= {r.action for r in rows}
    assert sum(r.n for r in rows) == sum(range(1, MAX_GROUPS + 6))
    assert next(r for r in rows if r.action == OTHER).n == sum(range(2, 7))


def test_default_key_groups_tool_calls_by_name_and_canonical_arguments(world):
    same = [world.action_of(0, u, order) for u in (0.1, 0.9) for order in (0.1, 0.4, 0.8)]
    assert len({json.dumps(a) for a in same}) > 1  # call ids and key order differ...
    assert {default_action_key(a) for a in same} == {
        'read_policy({"lang":"en","topic":"fares"})'}  # ...the decision does not
    reply = {"role": "assistant", "content": "Which fare?", "tool_calls": []}
    assert default_action_key(reply) == "Which fare?"
    said = {**world.action_of(1), "content": "Booking it now."}
    assert default_action_key(said) == default_action_key(world.action_of(1))
    assert default_action_key({"step": 2, "choice": "bad"}) == '{"choice":"bad","step":2}'
    assert default_action_key("plain text") == "plain text"


def test_a_users_action_key_groups_by_what_it_returns(world):
    def tool(action):
        calls = action.get("tool_calls") or []
        return calls[0]["function"]["name"] if calls else "reply"

    run = world.failing_run()
    res = ContrastiveSettings(rollouts=64, alpha=ALPHA, action_key=tool).run(
        run, world.agent(), world.judge)
    s = _locus_step(res)
    # one interval per group at 99.5%, three groups: a miss has probability <= 0.015
    truth = {"read_policy": 0.45, "book_fare": 0.5, "reply": 0.05}
    assert {a.action for a in s.alternatives} == set(truth)
    assert all(a.share_ci.low <= truth[a.action] <= a.share_ci.high for a in s.alternatives)
    assert s.recorded_action == "book_fare"
    assert res.params["action_key"].endswith("tool")  # a function is stored by its name


@pytest.mark.parametrize("key, said", [(lambda a: 3, "returned int"),
                                       ("tool", "not callable"),
                                       (lambda a: a["missing"], "raised")])
def test_a_broken_action_key_is_refused_before_any_rollout(world, key, said):
    run = world.failing_run()
    calls = []

    def judge(r, rng):
        calls.append(1)
        return world.judge(r, rng)

    with pytest.raises(InvalidInput, match=said):
        car.contrastive(run, world.agent(), outcome=judge, rollouts=8, action_key=key)
    assert len(calls) <= 1  # at most the check that the outcome reads the recorded run


def test_json_keys_are_stable_and_round_trip(results):
    _run, res = results[0]
    row = res.to_dict()["steps"][res.locus]
    assert [list(a) for a in row["alternatives"]] == [KEYS] * len(row["alternatives"])
    first = row["alternatives"][0]
    assert isinstance(first["share_ci"], list) and len(first["share_ci"]) == 2
    assert ContrastiveResult.from_dict(json.loads(json.dumps(res.to_dict()))) == res


def test_rows_stored_before_alternatives_still_load(results):
    _run, res = results[0]
    data = res.to_dict()
    for s in data["steps"]:
        del s["alternatives"], s["recorded_action"]
    old = ContrastiveResult.from_dict(data)
    assert all(s.alternatives == () and s.recorded_action is None for s in old.steps)
    assert "What the agent did instead" not in str(old)
    assert Alternative.from_dict({"action": "x", "share": 1.0, "share_ci": [0.5, 1.0],
                                  "p_fail": None, "p_fail_ci": None, "n": 3},
                                 0.9).share_ci.level == 0.9


def test_report_puts_the_table_beside_the_rescue_plot(world, results):
    run, res = results[0]
    html = render_attribution(res, run)
    plot, table = html.index('id="rescue-plot"'), html.index('id="alternatives"')
    assert plot < table < html.index('id="arms"')
    assert f'id="alternatives-step-{world.at}"' in html
    assert 'class="recorded"' in html and "(recorded)" in html


def _result_with(step: StepEffect, run: Trajectory) -> ContrastiveResult:
    return ContrastiveResult(
        run_id=run.id, locus=0, reason=None, alpha=0.05, tests=1, level=0.95,
        rollouts_used=8, rollouts_cap=8, seed=0, coupled=True, truncated=False,
        budget_note=None, tokens=0, cost=0.0, search="bisection", steps=(step,), arms=())


def test_the_cli_shows_the_table_and_writes_it_in_json(tmp_path):
    (tmp_path / "desk.py").write_text(textwrap.dedent('''
        from car_core.testing.synthetic_choices import PlantedChoices

        WORLD = PlantedChoices()

        def make():
            return WORLD.agent()

        def judge(run, rng):
            return WORLD.judge(run, rng)
    '''))
    env = {**os.environ, "COLUMNS": "160", "PYTHONPATH": str(Path(__file__).parents[1])}
    code = ("import car_core as car, desk\nrun = desk.WORLD.failing_run()\n"
            "car.RunStore('car.db').save(run); print(run.id)")
    run_id = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, env=env,
                            capture_output=True, text=True).stdout.strip()

    def car_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "car_core.cli", "attribute", run_id,
                               "--agent", "desk:make", "--outcome", "desk:judge",
                               "--rollouts", "48", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    shown = car_cli()
    assert shown.returncode == 0, shown.stderr
    assert "What the agent did instead at step 1 (" in shown.stdout
    assert 'book_fare({"fare":"business"}) (recorded)' in shown.stdout
    out = car_cli("--json")
    assert out.returncode == 0, out.stderr
    step = json.loads(out.stdout)["steps"][1]
    assert [list(a) for a in step["alternatives"]] == [KEYS] * len(step["alternatives"])


def test_the_cli_takes_an_action_key_as_module_function(tmp_path):
    (tmp_path / "desk.py").write_text(textwrap.dedent('''
        from car_core.testing.synthetic_choices import PlantedChoices

        WORLD = PlantedChoices()
        NOT_A_FUNCTION = 3

        def make():
            return WORLD.agent()

        def judge(run, rng):
            return WORLD.judge(run, rng)

        def tool(action):
            calls = action.get("tool_calls") or []
            return calls[0]["function"]["name"] if calls else "reply"
    '''))
    env = {**os.environ, "COLUMNS": "160", "PYTHONPATH": str(Path(__file__).parents[1])}
    code = ("import car_core as car, desk\nrun = desk.WORLD.failing_run()\n"
            "car.RunStore('car.db').save(run); print(run.id)")
    run_id = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, env=env,
                            capture_output=True, text=True).stdout.strip()

    def car_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "car_core.cli", "attribute", run_id,
                               "--agent", "desk:make", "--outcome", "desk:judge", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)

    out = car_cli("--rollouts", "64", "--alpha", str(ALPHA), "--action-key", "desk:tool",
                  "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    step = data["steps"][data["locus"]]
    # as in test_a_users_action_key_groups_by_what_it_returns: three groups, each interval at
    # 99.5%, a miss has probability <= 0.015
    truth = {"read_policy": 0.45, "book_fare": 0.5, "reply": 0.05}
    assert {a["action"] for a in step["alternatives"]} == set(truth)
    assert all(a["share_ci"][0] <= truth[a["action"]] <= a["share_ci"][1]
               for a in step["alternatives"])
    assert step["recorded_action"] == "book_fare"
    assert data["params"]["action_key"] == "tool"
    for args, said in ((("--action-key", "desk:NOT_A_FUNCTION"), "is not callable"),
                       (("--action-key", "desk:nowhere"), "has no attribute"),
                       (("--action-key", "desk:tool", "--method", "shapley"),
                        "--action-key applies to contrastive only")):
        refused = car_cli(*args)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr


def test_two_actions_alike_in_their_first_characters_are_shown_apart():
    """Two reports that differ only past the cell's width were printed as the same text, their
    rows told apart by P(fail) alone (user trial); each now shows where it differs."""
    from car_core import formatting as fmt
    start = 'write_report({"report_content":"# History of the internet\\nARPANET began in 1969'
    bad, good = start + ' and a rumour says..."})', start + ' and grew into the web."})'
    s = {"step": 3, "recorded_action": bad,
         "alternatives": [{"action": bad, "n": 3}, {"action": good, "n": 3},
                          {"action": "reply('ok')", "n": 1}]}
    shown = [fmt.alternative_cells(s, a)[0] for a in s["alternatives"]]
    assert len(set(shown)) == 3 and all(len(x) <= 70 for x in shown)
    assert "rumour" in shown[0] and shown[0].endswith("(recorded)") and "grew" in shown[1]
    assert shown[2] == "reply('ok')"  # no twin: clipped as before
