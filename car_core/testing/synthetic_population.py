"""A planted population for triage: failed runs from two failure modes in known proportions.

``TwoModeDesk`` is one agent of ``n_steps`` tool-calling steps, decided by two agents: steps
before ``handoff`` by ``"intake"`` (node ``"intake"``), the rest by ``"refunds"`` (node
``"refunds"``). The run's context names its mode. In mode ``"early"`` step ``early_at`` (a
call of ``tools[early_at]``) decides the failure: it goes wrong with probability ``p_bad``,
every later step copies it, and the outcome is that choice; steps before it are coin flips the
outcome never reads. Mode ``"late"`` is the same at step ``late_at``. So a failing run of
either mode has its locus at that mode's step, with rescue ``1 − p_bad`` (the ``pivot`` of
``synthetic.py``), and a population of ``n`` failing runs of which ``n_early`` are early has
the planted shares ``n_early / n`` and ``1 − n_early / n``.

A planted fix: where the deciding step of the early mode sees the text ``fix`` (an
``instruction`` in its context, as ``car.add_instruction`` puts it, or a ``note`` in the tool
result just before it) it goes wrong with probability ``p_fixed`` instead of ``p_bad``; the
late mode never reads it. ``careful_policy()`` is the other way round: a policy (another
"model", for ``do_policy``) that goes wrong at the late mode's step with probability
``p_fixed`` and decides everything else as the desk's own. Both draw the same uniform per
step, so under shared noise a branch with the fix and one without differ only where the fix
acts: an early run's rescue by the instruction is exactly ``p_bad − p_fixed``, a late run's 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from car_core.engine.agent import FunctionAgent
from car_core.engine.replay import record
from car_core.errors import InvalidInput
from car_core.model.trajectory import History, Trajectory

TOOLS = ("lookup_order", "read_policy", "check_eligibility", "draft_reply", "issue_refund",
         "send_reply", "close_ticket", "log_case")
MODES = ("early", "late")


class _Policy:
    """The desk's policy, which reports who decided each step (``step_meta``)."""

    def __init__(self, desk: TwoModeDesk, careful: bool = False) -> None:
        self.desk = desk
        self.careful = careful  # the late mode's step goes wrong with p_fixed only
        self._last = threading.local()

    def __call__(self, history: History, rng: np.random.Generator) -> dict[str, Any]:
        d, k = self.desk, history.index
        at = d.step_of(history.context["mode"])
        u = float(rng.random())  # always drawn, so the noise streams stay aligned
        if k < at:
            choice = "a" if u < 0.5 else "b"  # never read by the outcome
        elif k == at:
            mode = history.context["mode"]
            fixed = (self.careful if mode == "late" else mode == "early" and d.sees_fix(history))
            choice = "bad" if u < (d.p_fixed if fixed else d.p_bad) else "good"
        else:
            choice = history.steps[at].action["arguments"]["choice"]
        self._last.agent = "intake" if k < d.handoff else "refunds"
        return {"name": TOOLS[k % len(TOOLS)], "arguments": {"choice": choice, "step": k}}

    def step_meta(self) -> dict[str, Any]:
        agent = getattr(self._last, "agent", None)
        return {"agent": agent, "node": agent} if agent else {}


@dataclass(frozen=True)
class TwoModeDesk:
    """See the module docstring."""

    n_steps: int = 6
    early_at: int = 1
    late_at: int = 4
    handoff: int = 3
    p_bad: float = 0.3
    fix: str = "read the refund policy before you decide"
    p_fixed: float = 0.0

    def __post_init__(self) -> None:
        if not (0 <= self.early_at < self.late_at < self.n_steps <= len(TOOLS)):
            raise InvalidInput(f"early_at={self.early_at}, late_at={self.late_at} in a "
                               f"{self.n_steps}-step run",
                               hint=f"need 0 <= early_at < late_at < n_steps <= {len(TOOLS)}")
        if not 0 < self.p_bad < 1:
            raise InvalidInput(f"p_bad={self.p_bad}", hint="need 0 < p_bad < 1")
        if not 0 <= self.p_fixed <= self.p_bad:
            raise InvalidInput(f"p_fixed={self.p_fixed}", hint="need 0 <= p_fixed <= p_bad")

    def sees_fix(self, history: History) -> bool:
        """Whether the step about to decide sees the planted fix: an ``instruction`` in the
        context, or a ``note`` in the tool result just before it, equal to ``fix``."""
        context = history.context if isinstance(history.context, dict) else {}
        if context.get("instruction") == self.fix:
            return True
        last = history.steps[-1].observation if history.steps else None
        return isinstance(last, dict) and last.get("note") == self.fix

    def careful_policy(self) -> Any:
        """Another "model" for ``do_policy``: it rescues the late mode, not the early one."""
        return _Policy(self, careful=True)

    def step_of(self, mode: str) -> int:
        return self.early_at if mode == "early" else self.late_at

    def agent_of(self, mode: str) -> str:
        return "intake" if self.step_of(mode) < self.handoff else "refunds"

    def tool_of(self, mode: str) -> str:
        return TOOLS[self.step_of(mode) % len(TOOLS)]

    def agent(self) -> FunctionAgent:
        n = self.n_steps
        return FunctionAgent(policy=_Policy(self), environment=lambda h, a, rng: {"ok": True},
                             is_final=lambda a: a["arguments"]["step"] == n - 1,
                             max_steps=n, name="two-mode-desk")

    @staticmethod
    def outcome(run: Trajectory) -> float:
        """1 when the run went wrong: the last step carries the deciding step's choice."""
        return 1.0 if run.steps and run.steps[-1].action["arguments"]["choice"] == "bad" \
            else 0.0

    def population(self, n_early: int, n_late: int, seed: int = 0,
                   ids: str | None = None) -> list[Trajectory]:
        """``n_early`` failing runs of the early mode then ``n_late`` of the late one, each
        the first failing run recorded from its own seed on (genuine draws, not forged).
        ``ids``: a name, and the runs get ids made from it and their position (16 hex
        characters, as recorded ids are) instead of fresh random ones, so that what a
        population estimate draws from a run's id (its attribution's seed) is the same every
        time: a test whose fresh ids happened to leave a run undecided failed one CI run in
        some hundreds."""
        agent, runs, s = self.agent(), [], seed
        for mode, count in (("early", n_early), ("late", n_late)):
            for _ in range(count):
                while True:
                    run = record(agent, context={"mode": mode}, outcome=self.outcome, seed=s)
                    s += 1
                    if run.failed:
                        runs.append(run)
                        break
        if ids is not None:
            runs = [dataclasses.replace(r, id=hashlib.sha256(f"{ids}-{i}".encode()).hexdigest()
                                        [:16]) for i, r in enumerate(runs)]
        return runs


def careful_policy() -> Any:
    """The default desk's ``careful_policy()``, as a factory ``car fix --policy`` can name."""
    return TwoModeDesk().careful_policy()


__all__ = ["MODES", "TOOLS", "TwoModeDesk", "careful_policy"]
