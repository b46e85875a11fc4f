"""Structural causal models with planted ground truth, for tests, benchmarks and the demo.

Each model is an agent of ``n_steps`` steps. A *free* step draws ``"bad"`` with probability
``bad_prob[k]`` (else ``"good"``); a *mechanical* step copies the choice of the pivot before it,
so resampling it changes nothing. The outcome reads the choices of the ``relevant`` steps through
a rule (all bad, any bad, majority bad, or nothing at all), and a noisy judge flips it with
probability ``flip``. Because the steps are independent draws, every quantity the estimators
report has a closed form here:

- arm ``H_j`` = P(fail | steps < j held at their factual choice, the rest live);
- rescue of step ``k`` = ``H_{k+1} − H_k`` and the locus = the latest step with rescue ≠ 0;
- the Shapley game ``v(S)`` = P(fail | steps in S held, the others resampled) and its values.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from car_core.engine.agent import FunctionAgent
from car_core.engine.replay import record
from car_core.errors import InvalidInput
from car_core.model.trajectory import History, Trajectory

RULES = ("all", "any", "majority", "none")


@dataclass(frozen=True)
class SyntheticSCM:
    """A synthetic agent with a known answer. See the module docstring for the semantics."""

    name: str
    n_steps: int
    bad_prob: tuple[float, ...]
    relevant: tuple[int, ...]
    rule: str = "all"
    flip: float = 0.0
    base_rate: float = 0.0
    mechanical: dict[int, int] = field(default_factory=dict)  # step -> the step it copies
    noisy_environment: bool = True
    description: str = ""

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise InvalidInput(f"unknown rule {self.rule!r}", hint=f"use one of {RULES}")
        if len(self.bad_prob) != self.n_steps:
            raise InvalidInput("bad_prob must give one probability per step")
        if any(k in self.mechanical for k in self.relevant):
            raise InvalidInput("the outcome must read free steps, not mechanical copies")

    # -- the agent -------------------------------------------------------------------------
    def policy(self, history: History, rng: np.random.Generator) -> dict[str, Any]:
        k = history.index
        u = float(rng.random())  # always drawn, so streams stay aligned whatever the step does
        if k in self.mechanical:
            choice = history.steps[self.mechanical[k]].action["choice"]
        else:
            choice = "bad" if u < self.bad_prob[k] else "good"
        return {"step": k, "choice": choice, "final": k == self.n_steps - 1}

    def environment(self, history: History, action: Any, rng: np.random.Generator) -> Any:
        obs: dict[str, Any] = {"ack": action["choice"]}
        if self.noisy_environment:
            obs["latency_ms"] = int(rng.integers(5, 50))  # irrelevant noise the tool returns
        return obs

    def agent(self) -> FunctionAgent:
        return FunctionAgent(policy=self.policy, environment=self.environment,
                             is_final=lambda a: bool(a.get("final")), max_steps=self.n_steps,
                             name=f"synthetic:{self.name}")

    def _fails(self, bad: Iterable[bool]) -> bool:
        flags = list(bad)
        if self.rule == "all":
            return all(flags)
        if self.rule == "any":
            return any(flags)
        if self.rule == "majority":
            return sum(flags) * 2 > len(flags)
        return False

    def outcome(self, run: Trajectory, rng: np.random.Generator) -> float:
        """1 when the planted failure happened (then flipped w.p. ``flip``)."""
        if self.rule == "none":
            fail = bool(rng.random() < self.base_rate)
        else:
            by_index = {s.index: s.action for s in run.steps}
            fail = self._fails(by_index.get(k, {}).get("choice") == "bad" for k in self.relevant)
        if self.flip and rng.random() < self.flip:
            fail = not fail
        return 1.0 if fail else 0.0

    def failing_run(self, seed: int = 0, tries: int = 100_000) -> Trajectory:
        """The first run from ``seed`` on whose relevant steps are all bad and that failed.
        Recorded by the agent itself, so it is a genuine draw, not a forged record."""
        for s in range(seed, seed + tries):
            run = record(self.agent(), context={"scm": self.name}, outcome=self.outcome, seed=s)
            bad = all(run.steps[k].action["choice"] == "bad" for k in self.relevant)
            if (bad or self.rule == "none") and run.failed:
                return run
        raise InvalidInput(f"no failing run of {self.name} within {tries} seeds")

    # -- the analytic answers --------------------------------------------------------------
    def value(self, coalition: Iterable[int]) -> float:
        """``v(S)`` = P(fail | steps in S held at their factual (bad) choice, the others
        redrawn). Relevant steps are free draws, so holding a step fixes its choice."""
        held = frozenset(coalition)
        if self.rule == "none":
            p = self.base_rate
        else:
            probs = [1.0 if k in held else self.bad_prob[k] for k in self.relevant]
            p = 0.0
            for flags in itertools.product([True, False], repeat=len(probs)):
                w = math.prod(q if f else 1 - q for f, q in zip(flags, probs, strict=True))
                p += w * self._fails(flags)
        return (1 - 2 * self.flip) * p + self.flip

    def arm(self, j: int) -> float:
        """``H_j`` = P(fail | steps < j held as recorded, steps ≥ j live)."""
        return self.value(range(j))

    def rescue(self, k: int) -> float:
        """Analytic rescue of step ``k``: ``H_{k+1} − H_k``."""
        return self.arm(k + 1) - self.arm(k)

    @property
    def locus(self) -> int | None:
        nonzero = [k for k in range(self.n_steps) if abs(self.rescue(k)) > 1e-12]
        return max(nonzero) if nonzero else None

    def shapley(self) -> tuple[float, ...]:
        """Exact Shapley values of every step for the game ``v``."""
        n = self.n_steps
        players = sorted(self.relevant)
        phi = [0.0] * n
        m = len(players)
        for i in players:
            others = [p for p in players if p != i]
            for r in range(m):
                for subset in itertools.combinations(others, r):
                    w = math.factorial(r) * math.factorial(m - r - 1) / math.factorial(m)
                    phi[i] += w * (self.value(set(subset) | {i}) - self.value(subset))
        return tuple(phi)


def _probs(n: int, default: float, **overrides: float) -> tuple[float, ...]:
    out = [default] * n
    for key, value in overrides.items():
        out[int(key.lstrip("s"))] = value
    return tuple(out)


def pivot(n_steps: int = 6, at: int = 2, p_bad: float = 0.3, flip: float = 0.0,
          name: str = "pivot") -> SyntheticSCM:
    """One pivotal step, then mechanical steps that copy it; earlier steps are irrelevant
    coin flips. Locus = ``at``; rescue = (1 − 2·flip)(1 − p_bad)."""
    probs = [0.5] * n_steps
    probs[at] = p_bad
    for k in range(at + 1, n_steps):
        probs[k] = 0.0
    mech = {k: at for k in range(at + 1, n_steps)}
    return SyntheticSCM(name=name, n_steps=n_steps, bad_prob=tuple(probs), relevant=(at,),
                        rule="all", flip=flip, mechanical=mech,
                        description=f"step {at} decides the failure; later steps only carry it out")


def late_pivot(n_steps: int = 24, at: int = 20, p_bad: float = 0.3, flip: float = 0.0
               ) -> SyntheticSCM:
    return pivot(n_steps, at, p_bad, flip, name="late-pivot")


def noisy_pivot(n_steps: int = 6, at: int = 2, p_bad: float = 0.3, flip: float = 0.1
                ) -> SyntheticSCM:
    return pivot(n_steps, at, p_bad, flip, name="noisy-pivot")


def and_game(p_bad: float = 0.3) -> SyntheticSCM:
    """Steps 0 and 1 fail only together; step 2 does nothing. φ = (0.455, 0.455, 0) at 0.3."""
    return SyntheticSCM(name="and", n_steps=3, bad_prob=(p_bad, p_bad, 0.5), relevant=(0, 1),
                        rule="all", description="steps 0 and 1 must both go wrong")


def or_game(p_bad: float = 0.3) -> SyntheticSCM:
    """Either of steps 0 and 1 is enough; step 2 does nothing."""
    return SyntheticSCM(name="or", n_steps=3, bad_prob=(p_bad, p_bad, 0.5), relevant=(0, 1),
                        rule="any", description="either step 0 or step 1 is enough")


def three_way(p_bad: float = 0.4) -> SyntheticSCM:
    """Steps 0, 2 and 3 must all go wrong; steps 1 and 4 do nothing."""
    return SyntheticSCM(name="three-way", n_steps=5, bad_prob=(p_bad, 0.5, p_bad, p_bad, 0.5),
                        relevant=(0, 2, 3), rule="all",
                        description="steps 0, 2 and 3 must all go wrong")


def and_pair(n_steps: int = 8, a: int = 3, b: int = 6, p_a: float = 0.5, p_b: float = 0.75,
             flip: float = 0.0) -> SyntheticSCM:
    """Two steps that each could have saved the run: it fails iff step ``a`` and step ``b``
    (``a < b``) both comply ("bad"), step ``a`` complying w.p. ``p_a`` and step ``b`` w.p.
    ``p_b``, independently; the other steps are coin flips the outcome never reads.

    The failing run has both complied. ``H_j`` holds steps ``< j`` at that run's choices and
    re-draws the rest, so with ``g = 1 − 2·flip``::

        H_j = g·p_a·p_b + flip    (j ≤ a: neither held)
        H_j = g·p_b + flip        (a < j ≤ b: step a held, step b re-drawn)
        H_j = g + flip            (j > b: both held)

    and the rescues ``H_{k+1} − H_k`` are ``g·p_b·(1 − p_a)`` at ``a``, ``g·(1 − p_b)`` at
    ``b`` and 0 elsewhere; they sum to ``H_n − H_0 = g·(1 − p_a·p_b)``. The point of
    commitment (the latest rise) is ``b`` whatever the sizes, while ``a`` matters too: its
    rescue is the larger one when ``p_b·(1 − p_a) > 1 − p_b``, e.g. ``p_a = 0.5``,
    ``p_b = 0.75`` gives 0.375 at ``a`` and 0.25 at ``b``."""
    if not 0 <= a < b < n_steps:
        raise InvalidInput(f"a={a}, b={b} in a {n_steps}-step run",
                           hint="need 0 <= a < b < n_steps")
    if not (0 < p_a < 1 and 0 < p_b < 1 and 0 <= flip < 0.5):
        raise InvalidInput(f"p_a={p_a}, p_b={p_b}, flip={flip}",
                           hint="need 0 < p_a, p_b < 1 and 0 <= flip < 0.5")
    probs = [0.5] * n_steps
    probs[a], probs[b] = p_a, p_b
    return SyntheticSCM(name="and-pair", n_steps=n_steps, bad_prob=tuple(probs),
                        relevant=(a, b), rule="all", flip=flip,
                        description=f"steps {a} and {b} must both comply; either could have "
                                    f"saved the run")


def no_cause(n_steps: int = 5, base_rate: float = 0.5) -> SyntheticSCM:
    """The failure happens with probability ``base_rate`` whatever the agent does."""
    return SyntheticSCM(name="no-cause", n_steps=n_steps, bad_prob=(0.5,) * n_steps,
                        relevant=(), rule="none", base_rate=base_rate,
                        description="no step matters; the failure is a coin flip")


def catalogue() -> dict[str, SyntheticSCM]:
    """Every planted model by name."""
    models = [pivot(), late_pivot(), noisy_pivot(), and_game(), or_game(), three_way(), no_cause()]
    return {m.name: m for m in models}


COUPLINGS = ("full", "steps", "none")
_BLOCK_BITS = 20  # rollout index r lives in block r >> 20 (navigation, confirmation, re-estimate)
_CHUNK = 64


class SampledArms:
    """The arms ``H_j`` of a planted model drawn straight from its definition, vectorised.

    The engine replays every step of every branch; here a rollout of arm ``j`` is the rule
    applied to the relevant steps, each bad if held (``k < j``: the failing run's relevant
    steps are all bad) or else bad with ``bad_prob[k]``, then the judge's flip — the same law as
    the engine's branches. ``coupling`` says which draws arms share at one rollout index:
    ``"full"`` (steps and judge, as the engine's coupled branches), ``"steps"`` (a judge that
    is not seeded) or ``"none"`` (independent arms). Draws come in chunks keyed by
    ``(seed, block, chunk)`` so they do not depend on the order they are asked for. Implements
    the ``ArmSource`` protocol of ``car_core.estimators.search`` under a rollout budget."""

    def __init__(self, model: SyntheticSCM, seed: int, budget: int,
                 coupling: str = "full") -> None:
        if coupling not in COUPLINGS:
            raise InvalidInput(f"coupling={coupling!r}", hint=f"use one of {COUPLINGS}")
        self.model, self.seed, self.budget, self.coupling = model, seed, budget, coupling
        self.spent = 0
        self._rel = list(model.relevant)
        self._p = np.array([model.bad_prob[k] for k in self._rel], dtype=float)
        self._ys: dict[tuple[int, int], np.ndarray] = {}
        self._noise: dict[tuple[int, int, int], np.ndarray] = {}

    @property
    def remaining(self) -> int:
        return max(0, self.budget - self.spent)

    def _chunk(self, block: int, arm: int, chunk: int, part: int) -> np.ndarray:
        # part 0: the steps' uniforms, part 1: the judge's (base rate, flip)
        shared = self.coupling == "full" or (self.coupling == "steps" and part == 0)
        key = (block, -1 if shared else arm, chunk * 2 + part)
        if key not in self._noise:
            cols = max(len(self._rel), 1) if part == 0 else 2
            rng = np.random.default_rng([self.seed, block, key[1] + 1, chunk, part])
            self._noise[key] = rng.random((_CHUNK, cols))
        return self._noise[key]

    def _draw(self, arm: int, block: int, rows: np.ndarray) -> np.ndarray:
        """Outcomes of ``arm`` at the rollout ``rows`` of ``block`` (any order)."""
        chunk = rows // _CHUNK
        u = np.empty((rows.size, max(len(self._rel), 1)))
        judge = np.empty((rows.size, 2))
        for c in np.unique(chunk):
            at = chunk == c
            u[at] = self._chunk(block, arm, int(c), 0)[rows[at] % _CHUNK]
            judge[at] = self._chunk(block, arm, int(c), 1)[rows[at] % _CHUNK]
        m = self.model
        if m.rule == "none":
            fail = judge[:, 0] < m.base_rate
        else:
            held = np.array([k < arm for k in self._rel], dtype=bool)
            bad = held[None, :] | (u[:, :len(self._rel)] < self._p[None, :])
            if m.rule == "all":
                fail = np.asarray(bad.all(axis=1))
            elif m.rule == "any":
                fail = np.asarray(bad.any(axis=1))
            else:
                fail = np.asarray(bad.sum(axis=1) * 2 > len(self._rel))
        if m.flip:
            fail = fail ^ (judge[:, 1] < m.flip)
        return fail.astype(float)

    def _arm(self, arm: int, block: int, upto: int) -> np.ndarray:
        """The arm's outcomes in ``block`` so far (NaN where not run), at least ``upto`` long."""
        have = self._ys.get((arm, block), np.zeros(0))
        if have.size < upto:
            have = np.concatenate([have, np.full(max(upto, 2 * have.size) - have.size, np.nan)])
            self._ys[(arm, block)] = have
        return have

    def _run(self, arm: int, block: int, rows: np.ndarray) -> None:
        ys = self._arm(arm, block, int(rows.max()) + 1 if rows.size else 0)
        todo = rows[np.isnan(ys[rows])] if rows.size else rows
        if todo.size:
            ys[todo] = self._draw(arm, block, todo)
            self.spent += int(todo.size)

    def _missing(self, arm: int, block: int, rows: np.ndarray) -> np.ndarray:
        """Which of ``rows`` the arm has not run yet."""
        ys = self._ys.get((arm, block), np.zeros(0))
        out = np.ones(rows.size, dtype=bool)
        inside = rows < ys.size
        out[inside] = np.isnan(ys[rows[inside]])
        return out

    def _split(self, indices: Sequence[int]) -> tuple[int, np.ndarray]:
        rows = np.asarray(list(indices) if not isinstance(indices, range) else
                          np.arange(indices.start, indices.stop), dtype=np.int64)
        if rows.size == 0:
            return 0, rows
        block = int(rows[0]) >> _BLOCK_BITS
        if np.any(rows >> _BLOCK_BITS != block):
            raise InvalidInput("SampledArms serves indices of one block at a time")
        return block, rows & ((1 << _BLOCK_BITS) - 1)

    def _reach(self, hi: int, lo: int, indices: Sequence[int]) -> tuple[int, np.ndarray]:
        """The block and the longest prefix of ``indices`` the budget lets both arms reach."""
        block, rows = self._split(indices)
        cost = np.cumsum(self._missing(hi, block, rows).astype(int)
                         + self._missing(lo, block, rows).astype(int))
        want = int(np.searchsorted(cost, self.remaining, side="right"))
        return block, rows[:want]

    def outcomes(self, arm: int, indices: Sequence[int]) -> np.ndarray:
        block, rows = self._split(indices)
        cost = np.cumsum(self._missing(arm, block, rows).astype(int))
        rows = rows[:int(np.searchsorted(cost, self.remaining, side="right"))]
        if rows.size == 0:
            return np.zeros(0)
        self._run(arm, block, rows)
        return np.asarray(self._ys[(arm, block)][rows])

    def drawn(self, arm: int, indices: Sequence[int]) -> np.ndarray:
        """The arm's outcomes already drawn at ``indices``, in order, running none: what a
        search left behind, read back without spending the budget."""
        block, rows = self._split(indices)
        ys = self._ys.get((arm, block), np.zeros(0))
        rows = rows[rows < ys.size]
        got = ys[rows]
        return np.asarray(got[~np.isnan(got)])

    def diffs(self, hi: int, lo: int, indices: Sequence[int]) -> np.ndarray:
        block, rows = self._reach(hi, lo, indices)
        if rows.size == 0:
            return np.zeros(0)
        self._run(hi, block, rows)
        self._run(lo, block, rows)
        return np.asarray(self._ys[(hi, block)][rows] - self._ys[(lo, block)][rows])

    def means(self, hi: int, lo: int, indices: Sequence[int]) -> tuple[float, float]:
        block, rows = self._reach(hi, lo, indices)
        a = self._ys.get((hi, block), np.zeros(0))[rows] if rows.size else np.zeros(0)
        b = self._ys.get((lo, block), np.zeros(0))[rows] if rows.size else np.zeros(0)
        return (float(a.mean()) if a.size else float("nan"),
                float(b.mean()) if b.size else float("nan"))


class PlantedDesk:
    """A refund desk with a planted pivot, written the way users write agents: a policy, a
    tool and an LLM-judge-like outcome — for benchmarking the estimators through the engine at
    each level of shared noise.

    Steps ``< at`` look things up (coin flips the outcome never reads); step ``at`` decides
    ``"approve"`` with probability ``rescue`` (the recorded run denied); later steps write the
    reply from that decision. The judge reads the final reply, calls a denial a failure, and
    errs with probability ``flip``. So ``H_j = (1 − 2·flip)(1 − rescue) + flip`` for
    ``j ≤ at`` and ``1 − flip`` after, the rescue at ``at`` is ``(1 − 2·flip)·rescue`` and
    every other step's is 0 (``locus = at``); ``rescue = 0`` plants no cause at all (then
    ``flip = 0.5`` makes the judge a fair coin).

    ``coupling`` says where the randomness comes from: ``"full"`` — policy, tool and judge
    draw from CAR's noise (a seeded local model); ``"steps"`` — the judge draws from a stream of
    its own (an unseeded LLM judge); ``"none"`` — nothing draws from CAR's noise (a hosted
    model that ignores its seed, judged by another). The agent does not say which: like a
    user's, it is a plain ``FunctionAgent``, so the estimator has to find out. The private
    stream is seeded from ``seed`` and advances with every call, so a benchmark table
    reproduces while no two calls share a draw."""

    def __init__(self, n_steps: int, at: int, rescue: float, flip: float = 0.0,
                 coupling: str = "full", seed: int = 0) -> None:
        if coupling not in COUPLINGS:
            raise InvalidInput(f"coupling={coupling!r}", hint=f"use one of {COUPLINGS}")
        if not 0 <= at < n_steps:
            raise InvalidInput(f"at={at} is not a step of a {n_steps}-step run")
        if not (0 <= rescue < 1 and 0 <= flip <= 0.5):
            raise InvalidInput(f"rescue={rescue}, flip={flip}",
                               hint="need 0 <= rescue < 1 and 0 <= flip <= 0.5")
        self.n_steps, self.at, self.rescue, self.flip = n_steps, at, rescue, flip
        self.coupling, self.seed = coupling, seed
        self._own = np.random.default_rng([seed, 0x0DE5C])

    def _draw(self, rng: np.random.Generator, shared: bool) -> float:
        return float((rng if shared else self._own).random())

    def policy(self, history: History, rng: np.random.Generator) -> dict[str, Any]:
        k = history.index
        u = self._draw(rng, self.coupling != "none")
        if k < self.at:
            return {"step": k, "tool": "lookup", "field": "address" if u < 0.5 else "orders"}
        if k == self.at:
            return {"step": k, "tool": "decide", "decision": "approve" if u < self.rescue
                    else "deny"}
        decision = history.steps[self.at].action["decision"]
        words = "refund issued" if decision == "approve" else "refund denied"
        return {"step": k, "tool": "reply", "text": f"{words} (draft {int(u * 100)})",
                "final": k == self.n_steps - 1}

    def environment(self, history: History, action: Any, rng: np.random.Generator) -> Any:
        return {"ok": True, "latency_ms": int(5 + 45 * self._draw(rng, self.coupling != "none"))}

    def agent(self) -> FunctionAgent:
        return FunctionAgent(policy=self.policy, environment=self.environment,
                             is_final=lambda a: bool(a.get("final")),
                             max_steps=self.n_steps, name=f"planted-desk:{self.n_steps}")

    def judge(self, run: Trajectory, rng: np.random.Generator) -> float:
        """1 when the final reply denies the refund, wrong with probability ``flip``."""
        last = run.steps[-1].action if run.steps else {}
        text = last.get("text", "") if isinstance(last, dict) else ""
        fail = "denied" in text if self.at < self.n_steps - 1 else (
            isinstance(last, dict) and last.get("decision") == "deny")
        if self.flip and self._draw(rng, self.coupling == "full") < self.flip:
            fail = not fail
        return 1.0 if fail else 0.0

    def failing_run(self, tries: int = 100_000) -> Trajectory:
        """The first recorded run from ``seed`` on that denied and was judged a failure."""
        agent = self.agent()
        for s in range(self.seed, self.seed + tries):
            run = record(agent, context={"desk": self.n_steps}, outcome=self.judge, seed=s)
            if run.steps[self.at].action["decision"] == "deny" and run.failed:
                return run
        raise InvalidInput(f"no failing run of the planted desk within {tries} seeds")

    def arm(self, j: int) -> float:
        """``H_j``: P(fail | steps < j held as recorded, the rest live)."""
        p = 1.0 if j > self.at else 1.0 - self.rescue
        return (1 - 2 * self.flip) * p + self.flip

    def effect(self, k: int) -> float:
        return self.arm(k + 1) - self.arm(k)

    @property
    def locus(self) -> int | None:
        return self.at if self.rescue > 0 else None
