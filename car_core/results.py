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
from car_core.model.json_fields import Codec, Row, dump_fields, load_fields, nested, value
from car_core.model.vocabulary import Answer
from car_core.result_rows import CI as CI
from car_core.result_rows import Alternative as Alternative
from car_core.result_rows import ArmEstimate as ArmEstimate
from car_core.result_rows import GameValue as GameValue
from car_core.result_rows import ShapleyValue as ShapleyValue
from car_core.result_rows import StepEffect as StepEffect
from car_core.stats import NOT_MEASURED, Coupling, CouplingNumbers

COUPLING = Codec(lambda obj, name: getattr(obj, name).result_keys(),
                 lambda row, name, _: Coupling.from_result_keys(row))


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


# where the plain text (``str(result)``) says the method is: in Python, one call away
MEASURED = "how this was measured: res.explain()"


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


def _resume_call(method: str, budget: dict[str, Any], attribution_id: str | None,
                 extra: str = "") -> str:
    call = f"car.{method}(run, agent, outcome=..., budget={budget_call(budget)}{extra}"
    if attribution_id is None:
        return (f"run it again with a larger budget: {call}); pass store= and attribution_id= "
                "so the next one can resume")
    return (f"resume with a larger budget: {call}, store=<the store>, "
            f"attribution_id={attribution_id!r})")


# The ``caveats`` key of a result's JSON: present only when the agent said something, so the
# results of an agent with nothing to say read as they always have.
CAVEATS = Codec(lambda r, _: {"caveats": list(r.caveats)} if r.caveats else {},
                value(from_json=lambda v: tuple(v or ()), missing=()).load)
# the rollouts' tokens and cost: rows stored before they were counted read as none
SPENT = {"tokens": value(from_json=int, missing=0), "cost": value(from_json=float, missing=0.0)}


def _load_answer(row: Row, name: str, _: Any) -> Answer:
    """The answer stored, or, for a result stored before results named it, the one it gave."""
    if row.get("answer"):
        return Answer(row["answer"])
    if row.get("locus") is not None:
        return Answer.LOCUS
    return Answer.UNDECIDED if row.get("truncated") else Answer.NO_CAUSE


@dataclass(frozen=True)
class ContrastiveResult(CouplingNumbers, _Rendered):
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
    coupled: bool  # whether ``measured_coupling`` showed sharing, not what the adapter claimed
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
    # how much index-paired arms shared their noise, measured from those pairs
    measured_coupling: Coupling = NOT_MEASURED
    given_up: tuple[int, ...] = ()  # candidate steps a futility bound gave up, in order
    more_rollouts: int | None = None  # when undecided: roughly what confirming would still cost
    caveats: tuple[str, ...] = ()  # what the agent said every result must show (agent.caveats)
    actions: tuple[str, ...] = ()  # what each recorded step did, in a few words (fmt.step_actions)
    # Δ: every step after the locus was shown to rescue less than this, but ``not_ruled_out``.
    # None: no claim about the later steps at all (``search="full"``, which reports each
    # step's interval instead; an empty ``not_ruled_out`` then clears nothing)
    indifference: float | None = None
    not_ruled_out: tuple[int, ...] = ()  # steps after the locus the budget left untested at Δ

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, _CONTRASTIVE, _CONTRASTIVE_KEYS, method="contrastive",
                           summary=fmt.answer(self))

    @classmethod
    def from_dict(cls, data: Row) -> ContrastiveResult:
        """The result ``to_dict`` wrote (also one stored by an earlier version)."""
        return load_fields(cls, data, _CONTRASTIVE, float(data["level"]))  # type: ignore[no-any-return]

    def table(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.steps]

    def larger_budget(self) -> dict[str, Any]:
        """The budget to resume an undecided attribution with (see ``larger_budget``)."""
        return larger_budget(self.params.get("budget"), self.budget_note,
                             self.rollout_budget or self.rollouts_used, self.more_rollouts)

    def cut_short(self) -> str | None:
        """For a result decided before a cap was reached (a locus, the steps after it ruled
        out: not ``truncated``), what the cap cut: the re-estimate of the rescue, never the
        answer. None where no cap was reached, or where it left the answer unfinished."""
        if self.truncated or not self.budget_note:
            return None
        return (f"the re-estimate was cut short by the budget ({self.budget_note}); the "
                "answer stands")

    def undecided_why(self) -> str:
        """Why an undecided result could not decide: the budget, or the branches that failed."""
        if self.truncated:
            note = (self.budget_note or "").removesuffix(" before the answer was decided")
            return ("the budget ran out before the answer was decided"
                    + (f" ({note})" if note else ""))
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
            return (f"the candidate is step {c} (chosen from the arms run so far; its own test "
                    "had not run)")
        return (f"the candidate is step {c}: rescue so far {fmt.effect(s.effect)} "
                f"{fmt.effect_interval(s.ci)} from {s.n} pair(s)")

    def _more_said(self) -> str:
        """"about N more rollouts would decide it", and, where the resume the hint names
        grows the budget by less (``larger_budget`` caps a rough N), that it does: a trial
        read "about 422 more" beside a hint of 240 in all as two answers."""
        said = f"about {self.more_rollouts} more rollouts would decide it"
        hinted = self.larger_budget().get("rollouts")
        spent = self.rollout_budget or self.rollouts_used
        if hinted and self.more_rollouts and int(hinted) < spent + self.more_rollouts:
            said += (f" (a rough figure: the resume the hint names grows the budget to "
                     f"{hinted} first, and looks again)")
        return said

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
        arms = [(f"  re-deciding from step {a.hold_before} on (steps before it held): "
                 if a.hold_before < len(self.steps) else
                 "  nothing re-decided (every step held as recorded): ")
                + fmt.failure_rate(a.mean, a.ci, a.ci.level, a.n)
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
                 *([f"given up as the candidate by a futility rule (its confirmation's "
                    "re-runs fit \"no rescue\" better than a rescue, the budget left could "
                    "not have shown one, or the search's other arms put the rise elsewhere; "
                    f"none of these says the step rescues nothing): step(s) "
                    f"{', '.join(map(str, self.given_up))}"]
                   if self.given_up else []),
                 *([self._more_said()] if self.more_rollouts else []),
                 *([f"truncated: {self.budget_note}"] if self.truncated else []),
                 *([cut] if (cut := self.cut_short()) else []),
                 *([f"{len(self.failures)} failed branch(es) left out"] if self.failures
                   else []),
                 "per step (n: the pairs each rescue and interval are about):", table,
                 *(["arms (failure rate when steps from j on are re-decided):", *arms,
                    "  (each arm's interval on its own, not adjusted for the search stopping "
                    "on the arms it chose; the answer rests on the per-step intervals)"]
                   if arms else [])]
        note = fmt.sample_note(self)
        instead = [self.alternatives_text(s.step, method=True) for s in self.steps
                   if s.alternatives]
        return "\n".join([*lines, *([note] if note else []), *instead])

    def alternatives_text(self, step: int, method: bool = False) -> str:
        """What the agent did instead at ``step`` when it was re-drawn: a heading and one row
        per group of actions, the recorded one marked ("" when the step lists none);
        ``method``: with the intervals' level, as ``explain`` shows it."""
        s = next((e for e in self.steps if e.step == step), None)
        if s is None or not s.alternatives:
            return ""
        rows = [fmt.alternative_cells(s, a) for a in s.alternatives]
        return "\n".join([fmt.alternatives_heading(s, self.level if method else None),
                          _text_table(list(fmt.ALTERNATIVE_COLUMNS), rows)])

    def __str__(self) -> str:
        return self.plain()

    def plain(self, measured: str | None = MEASURED, instead: bool = True) -> str:
        """The answer, each step's row, what the agent did instead at the locus (unless
        ``instead`` is false: a surface that prints every tested step's below) and what it
        cost, ending with where the method is (``measured``; none when it follows)."""
        rows = [fmt.step_row(self, s, missing="-") for s in self.steps]
        table = _text_table(list(fmt.PLAIN_COLUMNS),
                            [fmt.plain_cells(self, r) for r in rows])
        foot = (f"rollouts used {self.rollouts_used} of {self.rollout_budget}"
                + (f"; truncated: {self.budget_note}" if self.truncated else "")
                + (f"; {cut}" if (cut := self.cut_short()) else "")
                + (f"; {len(self.failures)} failed branch(es) left out" if self.failures else "")
                + (f"; {measured}" if measured else ""))
        hint = self.continue_hint()
        shown = self.alternatives_text(self.locus) if instead and self.locus is not None else ""
        return "\n".join([fmt.answer(self), table, *([shown] if shown else []), foot,
                          *([hint] if hint else []), *(f"caveat: {c}" for c in self.caveats)])


@dataclass(frozen=True)
class ShapleyResult(CouplingNumbers, _Rendered):
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
    # pairs; ``coupled`` says whether it showed sharing
    measured_coupling: Coupling = NOT_MEASURED
    caveats: tuple[str, ...] = ()  # what the agent said every result must show (agent.caveats)
    actions: tuple[str, ...] = ()  # what each recorded step did, in a few words (fmt.step_actions)

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, _SHAPLEY, _SHAPLEY_KEYS, method="shapley",
                           summary=fmt.answer(self))

    @classmethod
    def from_dict(cls, data: Row) -> ShapleyResult:
        """The result ``to_dict`` wrote (also one stored by an earlier version)."""
        return load_fields(cls, data, _SHAPLEY, float(data["level"]))  # type: ignore[no-any-return]

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
        return self.plain()

    def plain(self, measured: str | None = MEASURED) -> str:
        """The answer, each step's value and what it cost, ending with where the method is
        (``measured``; none when it follows)."""
        hint = self.continue_hint()
        foot = (f"rollouts used {self.rollouts_used} of {self.budget}"
                + (f"; truncated: {self.budget_note}" if self.truncated else "")
                + (f"; {len(self.failures)} failed branch(es) left out" if self.failures else "")
                + (f"; {measured}" if measured else ""))
        return "\n".join([fmt.answer(self),
                          _text_table(list(fmt.PLAIN_SHAPLEY_COLUMNS), self._rows(True)),
                          foot, *([hint] if hint else []),
                          *(f"caveat: {c}" for c in self.caveats)])


# The JSON's keys in the order earlier versions wrote them (the CLI's --json prints them so).
_CONTRASTIVE_KEYS = (
    "method", "run_id", "attribution_id", "locus", "answer", "candidate", "locus_label",
    "reason", "alpha", "correction", "tests", "level", "rollouts_used", "rollouts_cap",
    "rollout_budget", "seed", "coupled", "coupling", "truncated", "budget_note", "tokens",
    "cost", "search", "steps", "arms", "example_branch", "params", "failures",
    "coupling_measured", "coupling_ci", "coupling_pairs", "given_up", "more_rollouts",
    "indifference", "not_ruled_out", "actions", "summary", "caveats")
_CONTRASTIVE = {
    "answer": Codec(lambda r, _: {"answer": str(r.answer)}, _load_answer),
    "search": value(from_json=str, missing="full"),
    # a step's or an arm's interval without its own level gets the result's (the context)
    "steps": nested(StepEffect.from_dict, many=True, missing=()),
    "arms": nested(ArmEstimate.from_dict, many=True, missing=()),
    "measured_coupling": COUPLING, "caveats": CAVEATS, **SPENT}
_SHAPLEY_KEYS = (
    "method", "run_id", "attribution_id", "mode", "values", "total", "v_full", "v_empty",
    "efficiency_gap", "level", "rollouts_used", "budget", "truncated", "budget_note", "seed",
    "coupled", "coupling", "tokens", "cost", "reason", "params", "failures",
    "coupling_measured", "coupling_ci", "coupling_pairs", "actions", "summary", "caveats")
_SHAPLEY = {
    "values": nested(ShapleyValue.from_dict, many=True, missing=()),
    "v_full": nested(GameValue.from_dict), "v_empty": nested(GameValue.from_dict),
    "measured_coupling": COUPLING, "caveats": CAVEATS, **SPENT}

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
