"""``car attribute`` takes what ``car.contrastive`` and ``car.shapley`` take: the search, and
the token, money and wall-time caps of ``car.Budget`` (with its price table)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from car_core.store import RunStore
from car_core.testing import synthetic as syn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "support"))

from cli_golden import _car  # noqa: E402

# every live step of a branch reports 10 prompt tokens (TokenAgent) from model "m1"
PRICED = f'''
import sys
from dataclasses import replace
sys.path.insert(0, {str(HERE)!r})
import car_core as car
from car_core.testing import synthetic
from _estimator_helpers import TokenAgent


class Priced(TokenAgent):
    def branch(self, run, plan, noise):
        traj = super().branch(run, plan, noise)
        steps = [replace(s, meta={{**s.meta, "model": "m1"}})
                 if s.meta.get("origin") == "live" else s for s in traj.steps]
        return car.Trajectory.new(context=traj.context, steps=steps, seed=traj.seed,
                                  agent=traj.agent, status=traj.status)


def agent():
    return Priced(synthetic.pivot().agent())


outcome = synthetic.pivot().outcome
'''


@pytest.fixture
def pivot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    return _stored(syn.pivot().failing_run(0), tmp_path, monkeypatch)


def _stored(run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """``run`` in a fresh store, in a folder that holds the priced agent's module."""
    (tmp_path / "priced_agent.py").write_text(PRICED, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = str(tmp_path / "car.db")
    with RunStore(db) as s:
        s.save(run)
    return run.id, db


def _attribute(run_id: str, db: str, *flags: str,
               agent: str = "priced_agent:agent") -> tuple[int, dict, str]:
    scored = ("--outcome", "priced_agent:outcome") if agent.startswith("priced") else ()
    code, out, err = _car("attribute", run_id, "--agent", agent, *scored, "--store", db,
                          "--json", *flags)
    return code, (json.loads(out) if out.strip() else {}), err


def test_search_reaches_the_estimator(pivot) -> None:
    code, res, err = _attribute(*pivot, "--search", "full", "--rollouts", "8",
                                agent="car_core.synthetic:pivot")
    assert code in (0, 1), err
    assert res["search"] == "full" and res["params"]["search"] == "full"
    assert res["correction"] == "bonferroni"  # the full search's test, not the betting one
    code, _, err = _attribute(*pivot, "--search", "full", "--method", "shapley",
                              agent="car_core.synthetic:pivot")
    assert code == 2 and "--search applies to contrastive only" in err


def test_an_undecided_full_search_with_budget_left_says_how_to_go_on(pivot) -> None:
    """A full search whose intervals still reached the indifference level stopped with budget
    left, said "Undecided" and exited 1, "nothing attributable", with no way on (a trial);
    more re-runs decide it, so it exits 3 with the resume command, and that command works."""
    run_id, db = pivot
    code, res, err = _attribute(run_id, db, "--search", "full", "--rollouts", "2",
                                agent="car_core.synthetic:pivot")
    assert code == 3, err
    assert res["answer"] == "undecided" and not res["truncated"] and not res["failures"]
    assert "undecided (attribution" in err and "to continue, resume with a larger budget" in err
    command = shlex.split(err.strip().splitlines()[-1])
    assert command[:2] == ["car", "attribute"] and "--resume" in command
    for _ in range(4):  # each hint doubles the budget until the answer is decided
        code, out, err = _car(*command[1:], "--json")
        res = json.loads(out) if out.strip() else {}
        if code != 3:
            break
        command = shlex.split(err.strip().splitlines()[-1])
    assert code == 0 and res["answer"] == "locus" and res["locus"] == 2, err


def test_max_tokens_stops_before_the_cap_is_spent(pivot) -> None:
    # 10 tokens per live step, at most 6 live steps a branch: 300 tokens is at most a few
    # dozen branches, far fewer than the 96 the search may run
    code, res, err = _attribute(*pivot, "--max-tokens", "300", "--rollouts", "16")
    assert code == 3, err
    assert res["truncated"] and res["budget_note"] == "token budget of 300 would be exceeded"
    assert 0 < res["tokens"] <= 300
    assert res["params"]["budget"]["tokens"] == 300


def test_a_token_cap_that_counted_nothing_says_so(pivot) -> None:
    """The synthetic pivot's branches report no usage: --max-tokens 300 never came near
    tripping, and the answer said nothing of it, the user believing the spend was capped."""
    code, res, err = _attribute(*pivot, "--max-tokens", "300", "--rollouts", "8",
                                agent="car_core.synthetic:pivot")
    assert code == 0 and res["tokens"] == 0 and not res["truncated"], err
    assert (f"--max-tokens capped nothing: the {res['rollouts_used']} branch(es) reported no "
            "model tokens") in " ".join(err.split())
    code, res, err = _attribute(*pivot, "--max-tokens", "100000", "--rollouts", "8")
    assert code == 0 and res["tokens"] > 0, err  # the priced agent reports its tokens
    assert "capped nothing" not in err


def test_a_money_cap_whose_model_has_no_price_says_it_counted_nothing(pivot) -> None:
    """The recorded run names no model, so the cap is let through; its branches call m1,
    which no --price names: every branch cost 0, said after the answer."""
    code, res, err = _attribute(*pivot, "--max-cost", "0.5", "--price", "m9=1:1",
                                "--rollouts", "8")
    assert code == 0 and res["tokens"] > 0 and res["cost"] == 0, err
    said = " ".join(err.split())
    assert (f"--max-cost capped nothing: the {res['rollouts_used']} branch(es) reported no "
            "cost and no tokens of a model --price names") in said
    assert "--max-tokens" not in said


def test_max_cost_charges_tokens_at_the_price_given(pivot, tmp_path: Path) -> None:
    # m1 at 1000 per million input tokens: 10 tokens cost 0.01, so 0.5 buys 50 steps
    code, res, err = _attribute(*pivot, "--max-cost", "0.5", "--price", "m1=1000:0")
    assert code == 3, err
    assert res["budget_note"] == "cost budget of 0.5 would be exceeded"
    assert 0 < res["cost"] <= 0.5
    assert res["cost"] == pytest.approx(res["tokens"] * 1000 / 1e6)
    (tmp_path / "prices.json").write_text('{"m1": [1000, 0]}', encoding="utf-8")
    code, again, err = _attribute(*pivot, "--max-cost", "0.5", "--price-file", "prices.json")
    assert code == 3 and again["cost"] == res["cost"], err


def test_the_resume_after_a_cost_cap_doubles_the_cap_and_goes_on(pivot) -> None:
    # the resume printed kept --max-cost 0.5 (raising only --budget), so it stopped after the
    # same branches and printed itself again
    code, res, err = _attribute(*pivot, "--max-cost", "0.5", "--price", "m1=1000:0")
    assert code == 3 and res["budget_note"] == "cost budget of 0.5 would be exceeded", err
    resume = err.splitlines()[-1].strip()
    argv = shlex.split(resume)
    assert argv[argv.index("--max-cost") + 1] == "1" and argv.count("--max-cost") == 1
    assert argv[argv.index("--resume") + 1] == res["attribution_id"]
    code, again, err = _car(*argv[1:])
    again = json.loads(again)
    assert again["attribution_id"] == res["attribution_id"], err
    assert again["params"]["budget"]["cost"] == 1.0
    assert again["cost"] > res["cost"]  # it went on past where the first stopped


def test_max_seconds_is_the_budget_wall_time(pivot) -> None:
    code, res, err = _attribute(*pivot, "--max-seconds", "3600", "--rollouts", "8",
                                agent="car_core.synthetic:pivot")
    assert code == 0, err
    assert res["params"]["budget"]["wall_time"] == 3600 and not res["truncated"]


@pytest.fixture
def named_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """The pivot run as a model adapter records it: every step names the model it called."""
    from dataclasses import replace

    from car_core.model.trajectory import Trajectory
    base = syn.pivot().failing_run(0)
    run = Trajectory.new(context=base.context, seed=base.seed, agent=base.agent,
                         status=base.status,
                         steps=[replace(s, meta={**s.meta, "model": "m1"}) for s in base.steps])
    return _stored(run, tmp_path, monkeypatch)


def test_a_money_cap_no_price_could_count_is_refused_before_any_branch(named_model) -> None:
    """The steps name model m1, none reports a cost and no price names m1: every branch
    would cost 0 and the cap never trip (a trial's --max-cost ran to its rollout cap so).
    Refused, saying which price to give; with it the cap counts and stops the search."""
    run_id, db = named_model
    code, res, err = _attribute(run_id, db, "--max-cost", "0.5")
    assert code == 2 and not res, err
    assert "cannot be counted" in err and "--price m1=IN:OUT" in err
    with RunStore(db) as s:
        assert s.attributions() == [] and len(s.runs(branches=True)) == 1
    code, res, err = _attribute(run_id, db, "--max-cost", "0.5", "--price", "m9=1:1")
    assert code == 2 and "'m1'" in err, err  # a price for another model counts nothing
    code, res, err = _attribute(run_id, db, "--max-cost", "0.5", "--price", "m1=1000:0")
    assert code == 3 and res["budget_note"] == "cost budget of 0.5 would be exceeded", err


def test_the_api_refuses_an_uncountable_money_cap_before_any_branch(named_model) -> None:
    import car_core as car
    from car_core.errors import InvalidBudget
    run_id, db = named_model
    with RunStore(db) as s:
        run = s.load(run_id)
    agent = syn.pivot().agent()
    calls = []
    original = agent.branch
    agent.branch = lambda *a, **kw: calls.append(1) or original(*a, **kw)  # type: ignore
    for attribute in (car.contrastive, car.shapley):
        with pytest.raises(InvalidBudget, match="cannot be counted"):
            attribute(run, agent, outcome=syn.pivot().outcome, budget=car.Budget(cost=1.0))
    with pytest.raises(InvalidBudget, match="cannot be counted"):
        car.intervene(run, agent, car.do_resample(1), outcome=syn.pivot().outcome,
                      rollouts=4, budget=car.Budget(cost=1.0))
    with RunStore(db) as store:  # a triage refuses it before its row is stored
        with pytest.raises(InvalidBudget, match="cannot be counted"):
            car.triage([run], agent, outcome=syn.pivot().outcome,
                       budget=car.Budget(cost=1.0), store=store)
        assert store.attributions() == []
    assert calls == []


@pytest.mark.parametrize(("flags", "said"), [
    (("--max-cost", "1", "--price", "m1"), "--price 'm1' is not MODEL=IN:OUT"),
    (("--max-cost", "1", "--price", "m1=1"), "need two prices"),
    (("--max-cost", "1", "--price", "m1=-1:2"), "not negative"),
    (("--max-cost", "0"), "--max-cost 0.0 cannot pay for anything"),
    (("--max-seconds", "-5"), "--max-seconds -5.0 cannot pay for anything"),
    (("--max-cost", "1", "--price-file", "missing.json"), "cannot be read as JSON"),
])
def test_bad_caps_are_refused_by_flag_before_anything_runs(pivot, flags, said) -> None:
    code, res, err = _attribute(*pivot, *flags)
    assert code == 2 and said in err and not res, err


def test_a_model_name_with_a_colon_keeps_it() -> None:
    from car_core.cli import kit
    assert kit.parse_prices(["llama3:8b=0.1:0.2"]) == {"llama3:8b": (0.1, 0.2)}
