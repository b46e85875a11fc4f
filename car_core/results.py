"""What the estimators return: frozen result objects that serialise to one JSON schema.

The store keeps ``to_dict()`` as JSON and hands back the object (``result_from_dict``); the
CLI prints the object and writes ``to_dict()`` for ``--json``. The schema holds every number
shown and every parameter needed to reproduce the estimate.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from car_core import formatting as fmt
from car_core.errors import InvalidInput
from car_core.model.budget import budget_call, larger_budget
from car_core.model.vocabulary import Answer
from car_core.stats import Interval


def _ci(ci: Interval | None) -> list[float] | None:
    return None if ci is None else [float(ci[0]), float(ci[1])]


def _ci_level(ci: Interval | None) -> float | None:
    return None if ci is None else ci.level


def _read_ci(data: dict[str, Any], level: float | None) -> Interval | None:
    """The interval stored under ``ci``; results written before intervals carried their level
    (no ``ci_level``) get the result's ``level``, the level they were labelled with then."""
    bounds = data.get("ci")
    built = data.get("ci_level", level)
    return None if bounds is None else Interval.of(bounds, float(built if built is not None
                                                                 else 0.95))


def _text_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) for r in rows]
    return "\n".join(lines)


HtmlRenderer = Callable[[dict[str, Any]], str]
_html_renderer: HtmlRenderer | None = None


def render_html_with(renderer: HtmlRenderer) -> None:
    """Set what ``to_html`` renders a result's ``to_dict()`` with. The report reads results, so
    it sits above them: the package (``car_core/__init__``) hands it down here instead of the
    results importing the report."""
    global _html_renderer
    _html_renderer = renderer


class _Rendered:
    """JSON, HTML and notebook display shared by both result types."""

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def to_html(self) -> str:
        if _html_renderer is None:  # pragma: no cover - ``import car_core`` always sets it
            raise InvalidInput("no HTML renderer is set", hint="import car_core first")
        return _html_renderer(self.to_dict())

    def _repr_html_(self) -> str:
        return self.to_html()


@dataclass(frozen=True)
class StepEffect:
    """Rescue of one step: P(fail | step held) − P(fail | step resampled), both estimated."""

    step: int
    effect: float | None = None
    ci: Interval | None = None
    tested: bool = False
    significant: bool = False
    fail_held: float | None = None
    fail_resampled: float | None = None
    n: int = 0
    effect_raw: float | None = None  # the mean of the pairs the test stopped on
    # "refit": ``effect`` re-estimated after the test stopped, on fresh pairs and the test's
    # own but the one it stopped on (``refit_pooled`` of the ``refit_n``)
    estimate: str = "raw"
    refit_n: int = 0
    # P(fail) held and re-drawn over the re-estimate's ``refit_n`` pairs: the sample
    # ``effect`` and ``ci`` are about (``fail_held``/``fail_resampled`` are the test's pairs)
    refit_held: float | None = None
    refit_resampled: float | None = None
    refit_pooled: int = 0  # of the ``refit_n``, the test's own pairs pooled with the fresh

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "effect": self.effect, "ci": _ci(self.ci),
                "ci_level": _ci_level(self.ci), "tested": self.tested,
                "significant": self.significant, "fail_held": self.fail_held,
                "fail_resampled": self.fail_resampled, "n": self.n,
                "effect_raw": self.effect if self.effect_raw is None else self.effect_raw,
                "estimate": self.estimate, "refit_n": self.refit_n,
                "refit_held": self.refit_held, "refit_resampled": self.refit_resampled,
                "refit_pooled": self.refit_pooled}

    @classmethod
    def from_dict(cls, data: dict[str, Any], level: float | None = None) -> StepEffect:
        return cls(step=int(data["step"]), effect=data.get("effect"),
                   ci=_read_ci(data, level), tested=bool(data.get("tested", False)),
                   significant=bool(data.get("significant", False)),
                   fail_held=data.get("fail_held"), fail_resampled=data.get("fail_resampled"),
                   n=int(data.get("n", 0)), effect_raw=data.get("effect_raw"),
                   estimate=str(data.get("estimate", "raw")),
                   refit_n=int(data.get("refit_n", 0)),
                   refit_held=data.get("refit_held"),
                   refit_resampled=data.get("refit_resampled"),
                   refit_pooled=int(data.get("refit_pooled", 0)))


@dataclass(frozen=True)
class ArmEstimate:
    """Arm ``H_j``: P(fail | steps < j held as recorded, steps >= j live)."""

    hold_before: int
    mean: float
    ci: Interval
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"hold_before": self.hold_before, "mean": self.mean, "ci": _ci(self.ci),
                "ci_level": self.ci.level, "n": self.n}

    @classmethod
    def from_dict(cls, data: dict[str, Any], level: float | None = None) -> ArmEstimate:
        ci = _read_ci(data, level)
        assert ci is not None, "an arm estimate always has an interval"
        return cls(int(data["hold_before"]), float(data["mean"]), ci, int(data["n"]))


def _resume_call(method: str, budget: dict[str, Any], attribution_id: str | None,
                 extra: str = "") -> str:
    call = f"car.{method}(run, agent, outcome=..., budget={budget_call(budget)}{extra}"
    if attribution_id is None:
        return (f"run it again with a larger budget: {call}); pass store= and attribution_id= "
                "so the next one can resume")
    return (f"resume with a larger budget: {call}, store=<the store>, "
            f"attribution_id={attribution_id!r})")


def _caveats(caveats: tuple[str, ...]) -> dict[str, Any]:
    """The ``caveats`` key of a result's JSON: present only when the agent said something, so
    the results of an agent with nothing to say read as they always have."""
    return {"caveats": list(caveats)} if caveats else {}


def _legacy_answer(data: dict[str, Any]) -> Answer:
    """The answer of a result stored before results named it."""
    if data.get("locus") is not None:
        return Answer.LOCUS
    return Answer.UNDECIDED if data.get("truncated") else Answer.NO_CAUSE


@dataclass(frozen=True)
class ContrastiveResult(_Rendered):
    """The point of commitment of a failed run, with every rescue interval behind it."""

    run_id: str
    locus: int | None
    reason: str | None
    alpha: float
    tests: int
    level: float
    rollouts_used: int
    rollouts_cap: int
    seed: int
    coupled: bool
    truncated: bool
    budget_note: str | None
    tokens: int
    cost: float
    search: str
    steps: tuple[StepEffect, ...]
    arms: tuple[ArmEstimate, ...]
    example_branch: dict[str, Any] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    attribution_id: str | None = None
    failures: tuple[dict[str, Any], ...] = ()  # branches that failed after a retry, left out
    coupling: str | None = None  # why branches were (or were not) coupled
    rollout_budget: int | None = None  # the rollouts the estimate was allowed (n·K by default)
    correction: str = "bonferroni"
    locus_label: str | None = None  # which agent and which step, e.g. "account_agent, step 4"
    answer: str = Answer.NO_CAUSE  # locus / no cause / undecided (car_core.model.vocabulary.Answer)
    candidate: int | None = None  # when undecided: the step the search was testing
    # how much index-paired arms shared their noise, measured (stats.Coupling); ``coupled``
    # says whether that measurement showed sharing, not what the adapter claimed
    coupling_measured: float | None = None
    coupling_ci: Interval | None = None
    coupling_pairs: int = 0
    given_up: tuple[int, ...] = ()  # candidate steps a futility bound gave up, in order
    more_rollouts: int | None = None  # when undecided: roughly what confirming would still cost
    caveats: tuple[str, ...] = ()  # what the agent said every result must show (agent.caveats)
    actions: tuple[str, ...] = ()  # what each recorded step did, in a few words (fmt.step_actions)

    def to_dict(self) -> dict[str, Any]:
        return {"method": "contrastive", "run_id": self.run_id,
                "attribution_id": self.attribution_id, "locus": self.locus,
                "answer": str(self.answer), "candidate": self.candidate,
                "locus_label": self.locus_label,
                "reason": self.reason, "alpha": self.alpha, "correction": self.correction,
                "tests": self.tests, "level": self.level, "rollouts_used": self.rollouts_used,
                "rollouts_cap": self.rollouts_cap, "rollout_budget": self.rollout_budget,
                "seed": self.seed, "coupled": self.coupled, "coupling": self.coupling,
                "truncated": self.truncated, "budget_note": self.budget_note,
                "tokens": self.tokens, "cost": self.cost, "search": self.search,
                "steps": [s.to_dict() for s in self.steps],
                "arms": [a.to_dict() for a in self.arms],
                "example_branch": self.example_branch, "params": dict(self.params),
                "failures": list(self.failures),
                "coupling_measured": self.coupling_measured,
                "coupling_ci": _ci(self.coupling_ci), "coupling_pairs": self.coupling_pairs,
                "given_up": list(self.given_up), "more_rollouts": self.more_rollouts,
                "actions": list(self.actions), "summary": fmt.answer(self),
                **_caveats(self.caveats)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContrastiveResult:
        """The result ``to_dict`` wrote (also one stored by an earlier version)."""
        level = float(data["level"])
        return cls(
            run_id=str(data["run_id"]), locus=data.get("locus"), reason=data.get("reason"),
            alpha=float(data["alpha"]), tests=int(data["tests"]), level=level,
            rollouts_used=int(data["rollouts_used"]), rollouts_cap=int(data["rollouts_cap"]),
            seed=int(data["seed"]), coupled=bool(data["coupled"]),
            coupling=data.get("coupling"),
            truncated=bool(data["truncated"]), budget_note=data.get("budget_note"),
            tokens=int(data.get("tokens", 0)), cost=float(data.get("cost", 0.0)),
            search=str(data.get("search", "full")),
            steps=tuple(StepEffect.from_dict(s, level) for s in data.get("steps", [])),
            arms=tuple(ArmEstimate.from_dict(a, level) for a in data.get("arms", [])),
            example_branch=data.get("example_branch"), params=dict(data.get("params") or {}),
            attribution_id=data.get("attribution_id"),
            failures=tuple(data.get("failures") or ()),
            rollout_budget=data.get("rollout_budget"),
            correction=str(data.get("correction", "bonferroni")),
            locus_label=data.get("locus_label"),
            answer=Answer(data.get("answer") or _legacy_answer(data)),
            candidate=data.get("candidate"),
            coupling_measured=data.get("coupling_measured"),
            coupling_ci=_read_ci({"ci": data.get("coupling_ci")}, 0.95),
            coupling_pairs=int(data.get("coupling_pairs") or 0),
            given_up=tuple(data.get("given_up") or ()),
            more_rollouts=data.get("more_rollouts"),
            caveats=tuple(data.get("caveats") or ()),
            actions=tuple(data.get("actions") or ()))

    def table(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.steps]

    def larger_budget(self) -> dict[str, Any]:
        """The budget to resume an undecided attribution with (see ``larger_budget``)."""
        return larger_budget(self.params.get("budget"), self.budget_note,
                             self.rollout_budget or self.rollouts_used, self.more_rollouts)

    def undecided_why(self) -> str:
        """Why an undecided result could not decide: the budget, or the branches that failed."""
        if self.truncated:
            return f"the budget ran out before the answer was decided ({self.budget_note})"
        if self.failures:
            return (f"{len(self.failures)} branch(es) failed and were left out, so no cause "
                    "cannot be claimed")
        return self.reason or "the estimate stopped before the answer was decided"

    def candidate_text(self) -> str:
        """The step an undecided search was testing, with what it measured so far."""
        c = self.candidate
        if c is None:
            return "no step had been tested yet"
        s = next((e for e in self.steps if e.step == c), None)
        if s is None or not s.tested or s.effect is None:
            return f"the candidate is step {c} (not yet measured)"
        return (f"the candidate is step {c}: rescue so far {fmt.effect(s.effect)} "
                f"{fmt.effect_interval(s.ci)} from {s.n} pair(s)")

    def continue_hint(self) -> str | None:
        """For an undecided result, how to continue; None for a decided one."""
        if self.answer != Answer.UNDECIDED:
            return None
        return "to continue, " + _resume_call("contrastive", self.larger_budget(),
                                              self.attribution_id)

    def explain(self, who: str | None = None) -> str:
        """How this result was measured, complete: the answer in the method's words, the test,
        its level, the search, the coupling, every arm and every step with its sample size,
        the re-estimates, and what stopped or was left out."""
        rows = [fmt.step_row(self, s, missing="-") for s in self.steps]
        table = _text_table([*fmt.STEP_COLUMNS[:-1], ""],
                            [[*r.cells()[:-1], r.tested] if not r.is_locus else r.cells()
                             for r in rows])
        arms = [f"  re-deciding from step {a.hold_before} on (steps before it held): "
                f"{fmt.failure_rate(a.mean, a.ci, a.ci.level, a.n)}"
                for a in self.arms]
        lines = [f"How this was measured (contrastive attribution of run {self.run_id})",
                 f"answer: {fmt.headline(self, who)}",
                 *([f"reason: {self.reason}"] if self.reason else []),
                 f"method: {fmt.method(self)}; alpha {fmt.num(self.alpha, 3)}; "
                 f"search={self.search}",
                 f"coupling: {fmt.coupling(self)}"
                 + (f"; noise handed out: {self.coupling}" if self.coupling else ""),
                 f"rollouts used {self.rollouts_used} of {self.rollout_budget} (K="
                 f"{self.rollouts_cap} per arm); seed {self.seed}"
                 + (f"; tokens {self.tokens}" if self.tokens else "")
                 + (f"; cost {self.cost:g}" if self.cost else ""),
                 *([f"given up: step(s) {', '.join(map(str, self.given_up))}"]
                   if self.given_up else []),
                 *([f"about {self.more_rollouts} more rollouts would decide it"]
                   if self.more_rollouts else []),
                 *([f"truncated: {self.budget_note}"] if self.truncated else []),
                 *([f"{len(self.failures)} failed branch(es) left out"] if self.failures
                   else []),
                 "per step (n: the pairs each rescue and interval are about):", table,
                 *(["arms (failure rate when steps from j on are re-decided):", *arms]
                   if arms else [])]
        note = fmt.sample_note(self)
        return "\n".join([*lines, *([note] if note else [])])

    def __str__(self) -> str:
        rows = [fmt.step_row(self, s, missing="-") for s in self.steps]
        table = _text_table(list(fmt.PLAIN_COLUMNS),
                            [fmt.plain_cells(self, r) for r in rows])
        foot = (f"rollouts used {self.rollouts_used} of {self.rollout_budget}"
                + (f"; truncated: {self.budget_note}" if self.truncated else "")
                + (f"; {len(self.failures)} failed branch(es) left out" if self.failures else "")
                + "; how this was measured: res.explain()")
        hint = self.continue_hint()
        return "\n".join([fmt.answer(self), table, foot, *([hint] if hint else []),
                          *(f"caveat: {c}" for c in self.caveats)])


@dataclass(frozen=True)
class ShapleyValue:
    """One player's Shapley value: a step, or the other steps grouped (``step`` None)."""

    step: int | None
    label: str
    estimate: float | None
    ci: Interval | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "label": self.label, "estimate": self.estimate,
                "ci": _ci(self.ci), "ci_level": _ci_level(self.ci), "n": self.n}

    @classmethod
    def from_dict(cls, data: dict[str, Any], level: float | None = None) -> ShapleyValue:
        return cls(data.get("step"), str(data["label"]), data.get("estimate"),
                   _read_ci(data, level), int(data.get("n", 0)))


@dataclass(frozen=True)
class GameValue:
    """``v(S)`` for the full or the empty coalition, with its Wilson interval."""

    mean: float | None
    ci: Interval | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci": _ci(self.ci), "ci_level": _ci_level(self.ci),
                "n": self.n}

    @classmethod
    def from_dict(cls, data: dict[str, Any], level: float | None = None) -> GameValue:
        return cls(data.get("mean"), _read_ci(data, level), int(data.get("n", 0)))


@dataclass(frozen=True)
class ShapleyResult(_Rendered):
    """Shapley values of the steps for the game v(S) = P(fail | S held, the rest resampled)."""

    run_id: str
    mode: str
    values: tuple[ShapleyValue, ...]
    total: float | None
    v_full: GameValue
    v_empty: GameValue
    efficiency_gap: float | None
    level: float
    rollouts_used: int
    budget: int
    truncated: bool
    budget_note: str | None
    seed: int
    coupled: bool
    tokens: int
    cost: float
    reason: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    attribution_id: str | None = None
    failures: tuple[dict[str, Any], ...] = ()  # branches that failed after a retry, left out
    coupling: str | None = None  # what noise CAR handed the branches, and why
    # how much coalitions sharing a rollout index shared their noise, measured from those
    # pairs (stats.Coupling); ``coupled`` says whether it showed sharing
    coupling_measured: float | None = None
    coupling_ci: Interval | None = None
    coupling_pairs: int = 0
    caveats: tuple[str, ...] = ()  # what the agent said every result must show (agent.caveats)
    actions: tuple[str, ...] = ()  # what each recorded step did, in a few words (fmt.step_actions)

    def to_dict(self) -> dict[str, Any]:
        return {"method": "shapley", "run_id": self.run_id,
                "attribution_id": self.attribution_id, "mode": self.mode,
                "values": [v.to_dict() for v in self.values], "total": self.total,
                "v_full": self.v_full.to_dict(), "v_empty": self.v_empty.to_dict(),
                "efficiency_gap": self.efficiency_gap, "level": self.level,
                "rollouts_used": self.rollouts_used, "budget": self.budget,
                "truncated": self.truncated, "budget_note": self.budget_note, "seed": self.seed,
                "coupled": self.coupled, "coupling": self.coupling, "tokens": self.tokens,
                "cost": self.cost,
                "reason": self.reason, "params": dict(self.params),
                "failures": list(self.failures),
                "coupling_measured": self.coupling_measured,
                "coupling_ci": _ci(self.coupling_ci), "coupling_pairs": self.coupling_pairs,
                "actions": list(self.actions), "summary": fmt.answer(self),
                **_caveats(self.caveats)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShapleyResult:
        """The result ``to_dict`` wrote (also one stored by an earlier version)."""
        level = float(data["level"])
        return cls(
            run_id=str(data["run_id"]), mode=str(data["mode"]),
            values=tuple(ShapleyValue.from_dict(v, level) for v in data.get("values", [])),
            total=data.get("total"), v_full=GameValue.from_dict(data["v_full"], level),
            v_empty=GameValue.from_dict(data["v_empty"], level),
            efficiency_gap=data.get("efficiency_gap"), level=level,
            rollouts_used=int(data["rollouts_used"]), budget=int(data["budget"]),
            truncated=bool(data["truncated"]), budget_note=data.get("budget_note"),
            seed=int(data["seed"]), coupled=bool(data["coupled"]),
            coupling=data.get("coupling"),
            tokens=int(data.get("tokens", 0)), cost=float(data.get("cost", 0.0)),
            reason=data.get("reason"), params=dict(data.get("params") or {}),
            attribution_id=data.get("attribution_id"),
            failures=tuple(data.get("failures") or ()),
            coupling_measured=data.get("coupling_measured"),
            coupling_ci=_read_ci({"ci": data.get("coupling_ci")}, 0.95),
            coupling_pairs=int(data.get("coupling_pairs") or 0),
            caveats=tuple(data.get("caveats") or ()),
            actions=tuple(data.get("actions") or ()))

    def table(self) -> list[dict[str, Any]]:
        return [v.to_dict() for v in self.values]

    def larger_budget(self) -> dict[str, Any]:
        """The budget to resume a truncated attribution with (see ``larger_budget``)."""
        return larger_budget(self.params.get("budget"), self.budget_note, self.budget)

    def continue_hint(self) -> str | None:
        """For a truncated result, how to continue; None for one that spent what it planned."""
        if not self.truncated:
            return None
        # the mode is kept: a larger budget could make "auto" choose another one
        return "to continue, " + _resume_call("shapley", self.larger_budget(),
                                              self.attribution_id, f", mode={self.mode!r}")

    def _rows(self, plain: bool) -> list[list[str]]:
        actions = self.actions
        return [[v.label,
                 *([actions[v.step] if v.step is not None and 0 <= v.step < len(actions)
                    else fmt.MISSING] if plain else []),
                 fmt.effect(v.estimate, missing="-"), fmt.effect_interval(v.ci, missing="-"),
                 *([] if plain else [str(v.n)])] for v in self.values]

    def explain(self, who: str | None = None) -> str:
        """How these values were measured, complete: the largest value in the method's
        words, the mode and level, efficiency, every value with its sample size, the
        coupling and what stopped or was left out."""
        head = fmt.headline(self, who) + (f"; {self.reason}" if self.reason
                                          and self.reason not in fmt.headline(self) else "")
        return "\n".join([
            f"How this was measured (Shapley attribution of run {self.run_id})",
            f"answer: {head}",
            f"method: Shapley values, {fmt.method(self)}; sum = "
            f"{fmt.effect(self.total, missing='-')}; v(N) - v(empty) = "
            f"{fmt.prob(self.v_full.mean, missing='-')} - "
            f"{fmt.prob(self.v_empty.mean, missing='-')}; gap "
            f"{fmt.effect(self.efficiency_gap, missing='-')}",
            f"coupling: {fmt.coupling(self)}"
            + (f"; noise handed out: {self.coupling}" if self.coupling else ""),
            f"rollouts used {self.rollouts_used} of {self.budget}; seed {self.seed}"
            + (f"; tokens {self.tokens}" if self.tokens else "")
            + (f"; cost {self.cost:g}" if self.cost else ""),
            *([f"truncated: {self.budget_note}"] if self.truncated else []),
            *([f"{len(self.failures)} failed branch(es) left out"] if self.failures else []),
            _text_table(list(fmt.SHAPLEY_COLUMNS), self._rows(False))])

    def __str__(self) -> str:
        hint = self.continue_hint()
        foot = (f"rollouts used {self.rollouts_used} of {self.budget}"
                + (f"; truncated: {self.budget_note}" if self.truncated else "")
                + (f"; {len(self.failures)} failed branch(es) left out" if self.failures else "")
                + "; how this was measured: res.explain()")
        return "\n".join([fmt.answer(self),
                          _text_table(list(fmt.PLAIN_SHAPLEY_COLUMNS), self._rows(True)),
                          foot, *([hint] if hint else []),
                          *(f"caveat: {c}" for c in self.caveats)])


Result = ContrastiveResult | ShapleyResult


def result_from_dict(data: dict[str, Any]) -> Result:
    """A stored or exported result (``to_dict``), typed by its ``method``."""
    method = data.get("method")
    try:
        if method == "contrastive":
            return ContrastiveResult.from_dict(data)
        if method == "shapley":
            return ShapleyResult.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"a {method} result with a missing or malformed field: {exc!r}",
                           hint="re-run the attribution; the stored result was damaged") from exc
    raise InvalidInput(f"not a CAR result: method {method!r}",
                       hint="pass what ContrastiveResult/ShapleyResult.to_dict() wrote")
