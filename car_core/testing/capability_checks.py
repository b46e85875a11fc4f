"""One conformance check per optional capability (``car_core.model.capabilities``).

``run_conformance`` (``car_core.testing.conformance``) runs each check for an agent that offers the
capability; each raises ``ConformanceFailure`` saying what broke:

- ``ASYNC_BRANCH``: ``abranch`` is ``branch`` as a coroutine: under the same noise it gives the
  same branch and outcome when the agent couples its noise, the same outcome distribution (a
  paired sign-flip test at level ``alpha``) when it does not;
- ``STOP``: a branch given ``stop`` ends at the first point ``stop`` holds (on the held prefix or
  after a step), marked settled, and a ``stop`` that never holds cuts nothing;
- ``COUPLES_NOISE``: what the flag claims is measured: a branch that forces step 0's action
  to the one a ``do_resample(0)`` branch drew under the same noise must continue exactly as
  that branch did (it shares the noise of every later step), on every rollout;
- ``FINGERPRINT``: a fresh agent gives the same digest in this process and in a fresh Python
  interpreter with another hash seed, and the fingerprint names no memory address.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import re
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import numpy as np

from car_core.engine.agent import Agent, AsyncAgent, agent_fingerprint
from car_core.engine.branching import branch_scope
from car_core.engine.protocols import FingerprintedAgent, StoppableAgent
from car_core.engine.tasks import Task, score_branch
from car_core.model.actions import same_action
from car_core.model.capabilities import Capability, capabilities
from car_core.model.interventions import compile_plan, do_action, do_resample
from car_core.model.json_values import canonical, check_json
from car_core.model.outcome import OutcomeFn, OutcomeLike
from car_core.model.trajectory import Step, Trajectory
from car_core.model.vocabulary import RunStatus
from car_core.stats import coupling_of
from car_core.testing._conformance import AgentFactory, agent_of, fail, noise_for, sign_flip_p

__all__ = ["check_async_branch", "check_coupling_measured", "check_fingerprint_stable",
           "check_stop_honoured"]

def _differs(a: Sequence[Step], b: Sequence[Step], *, observations: bool = True
             ) -> int | None:
    """The first step at which two runs' steps differ (action, or observation unless
    ``observations`` is False), or None."""
    for k in range(max(len(a), len(b))):
        if k >= len(a) or k >= len(b):
            return k
        x, y = a[k], b[k]
        if not same_action(x.action, y.action) or observations and (
                x.observed, canonical(x.observation)) != (y.observed, canonical(y.observation)):
            return k
    return None


def _awaited(start: Callable[[], Awaitable[Trajectory]]) -> Trajectory:
    """Run a branch coroutine to its end on its own event loop, in a helper thread, as the
    asyncio executor does (so a check works whether or not a loop is running here)."""
    box: dict[str, Any] = {}

    def main() -> None:
        with branch_scope():
            try:
                box["value"] = asyncio.run(_as_coroutine(start()))
            except BaseException as exc:  # handed back to the caller's thread
                box["error"] = exc
    worker = threading.Thread(target=main, name="car-conformance-async")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


async def _as_coroutine(awaitable: Awaitable[Trajectory]) -> Trajectory:
    return await awaitable


def check_async_branch(agent: Agent, run: Trajectory, outcome: OutcomeLike, *,
                       rollouts: int = 8, alpha: float = 1e-3, seed: int = 0) -> None:
    """``abranch`` ≡ ``branch``: ``rollouts`` branches of ``do_resample(k)`` at the first and
    the last step, each run both ways under one noise and scored with one outcome stream.
    An agent that couples its noise must give the same steps and outcome both ways; one that
    does not must give outcomes whose paired differences pass a two-sided sign-flip test at
    ``alpha`` (a correct agent fails with probability at most ``alpha``)."""
    caps = capabilities(agent)
    if Capability.ASYNC_BRANCH not in caps:
        return
    async_agent = cast(AsyncAgent, agent)
    out = OutcomeFn(outcome)
    coupled = Capability.COUPLES_NOISE in caps
    diffs: list[float] = []
    n = len(run.steps)
    for k in sorted({0, n - 1}):
        plan = compile_plan(run, do_resample(k))
        for r in range(rollouts):
            noise = noise_for(seed, 100 + r)
            task = Task(arm="conformance-async", rollout=r, plan=plan, noise=noise)
            with branch_scope():
                sync = score_branch(run, agent.branch(run, plan, noise), agent, out, task)
            got = _awaited(lambda: async_agent.abranch(run, plan, noise))  # noqa: B023
            asynced = score_branch(run, got, agent, out, task)
            assert sync.outcome is not None and asynced.outcome is not None
            if coupled:
                at = _differs(sync.steps, asynced.steps)
                if at is not None:
                    fail("async", f"under the same noise (rollout {r} of do_resample({k})) "
                                  f"abranch differs from branch at step {at}", run, at,
                         hint="abranch must be branch as a coroutine: the same plan, noise "
                              "and held prefix")
                if sync.outcome.value != asynced.outcome.value:
                    fail("async", f"under the same noise abranch scored "
                                  f"{asynced.outcome.value:g}, branch {sync.outcome.value:g}",
                         run, k)
            diffs.append(asynced.outcome.value - sync.outcome.value)
    p = sign_flip_p(diffs, np.random.default_rng([seed, 0xa5]))
    if p < alpha:
        fail("async", f"P(fail) differs between abranch and branch over {len(diffs)} paired "
                      f"rollouts (sign-flip p = {p:.2g} < alpha = {alpha:g})", run)


def check_stop_honoured(agent: Agent, run: Trajectory, *, seed: int = 0) -> bool:
    """A branch given ``stop`` asks it, ends once it holds and is marked settled: after a
    live step (a branch from step 0) and on the held prefix (a branch from step 1), each
    forcing the recorded actions so the unstopped branch is the record's length. The branch
    may end at the agent's own granularity (a LangGraph superstep can decide several steps),
    but the branch it returns must satisfy ``stop`` and be shorter than the record. A ``stop``
    that never holds cuts nothing. Needs a run of at least two steps (returns False, having
    checked nothing, otherwise)."""
    if Capability.STOP not in capabilities(agent) or len(run.steps) < 2:
        return False
    n = len(run.steps)
    branch_with_stop = cast(StoppableAgent, agent).branch
    for k, where in ((0, "after step 0"), (1, "on the held prefix (step 0)")):
        plan = compile_plan(run, [do_action(j, run.steps[j].action) for j in range(k, n)])
        asked: list[int] = []
        stop = _stop_at(1, asked)
        with branch_scope():
            branch = branch_with_stop(run, plan, noise_for(seed, k), stop=stop)
        if not asked:
            fail("stop", f"a branch from step {k} given stop= never called it", run, k,
                 hint="call stop(branch so far) on the held prefix and after every step")
        if not 1 <= len(branch.steps) < n or branch.status != RunStatus.SETTLED:
            fail("stop", f"stop held {where}, but the branch has {len(branch.steps)} of {n} "
                         f"step(s) and status {branch.status!r} (want it cut short, status "
                         "'settled')", run, k,
                 hint="once stop(branch so far) is True, return that branch with status "
                      "RunStatus.SETTLED")
        if _differs(branch.steps, run.steps[:len(branch.steps)], observations=False) is not None:
            fail("stop", "the settled branch does not take the record's (forced) actions",
                 run, 0)
    plan = compile_plan(run, [do_action(j, run.steps[j].action) for j in range(n)])
    with branch_scope():
        whole = branch_with_stop(run, plan, noise_for(seed), stop=lambda partial: False)
    if len(whole.steps) != n or whole.status == RunStatus.SETTLED:
        fail("stop", f"a stop that never holds cut the branch to {len(whole.steps)} of {n} "
                     f"steps (status {whole.status!r})", run,
             hint="end a branch early only when stop(branch so far) is True")
    return True


def _stop_at(steps: int, asked: list[int]) -> Callable[[Trajectory], bool]:
    """A ``stop`` that holds once a branch has ``steps`` steps, noting each call in ``asked``."""
    def stop(partial: Trajectory) -> bool:
        asked.append(len(partial.steps))
        return len(partial.steps) >= steps
    return stop


def check_coupling_measured(agent: Agent, run: Trajectory, outcome: OutcomeLike, *,
                            rollouts: int = 8, seed: int = 0) -> None:
    """An agent that says ``couples_noise`` shares CAR's noise between arms, measured: for each
    of ``rollouts`` noises, a ``do_resample(0)`` branch and a branch forcing step 0 to the
    action that one drew reach the same state after step 0, so with shared noise they must
    continue identically. The failure names the first rollout that did not, with the share
    of identical pairs and the outcome coupling the pairs show (``stats.coupling_of``)."""
    if Capability.COUPLES_NOISE not in capabilities(agent):
        return
    out = OutcomeFn(outcome)
    xs: list[float] = []
    ys: list[float] = []
    first: tuple[int, int] | None = None
    same = 0
    for r in range(rollouts):
        noise = noise_for(seed, 200 + r)
        with branch_scope():
            drawn = agent.branch(run, compile_plan(run, do_resample(0)), noise)
            if not drawn.steps:
                continue
            forced = agent.branch(run, compile_plan(run, do_action(0, drawn.steps[0].action)),
                                  noise)
        xs.append(out.score(drawn, noise))
        ys.append(out.score(forced, noise))
        at = _differs(drawn.steps, forced.steps)
        if at is None and xs[-1] == ys[-1]:
            same += 1
        elif first is None:
            first = (r, at if at is not None else len(drawn.steps))
    if first is not None:
        measured = coupling_of([(xs, ys)])
        shown = "not measurable" if measured.estimate is None else f"{measured.estimate:.2f}"
        fail("coupling", f"the agent says couples_noise=True, but under the noise of rollout "
                         f"{first[0]} a branch forcing step 0 to the action do_resample(0) "
                         f"drew differs from it at step {first[1]} ({same} of {len(xs)} pairs "
                         f"identical; outcome coupling measured {shown})", run, first[1],
             hint="draw the model's and the tools' randomness from noise.rng(k, role) (or a "
                  "seed from noise.int_seed(k)), or set couples_noise=False so estimators "
                  "do not pair branches that share nothing")


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}| object at ")
_MARK = "CAR-FINGERPRINT "
_CHILD = (
    "import pickle, sys\n"
    "path, blob = pickle.loads(sys.stdin.buffer.read())\n"
    "sys.path[:0] = [p for p in path if p not in sys.path]\n"
    "made = pickle.loads(blob)()\n"
    "agent = made[0] if isinstance(made, tuple) else made\n"
    "from car_core.engine.agent import agent_fingerprint\n"
    f"print({_MARK!r} + agent_fingerprint(agent))\n")


def _shipped(factory: AgentFactory) -> bytes | None:
    """``factory`` pickled for another interpreter: by reference (a module-level function),
    else by value with cloudpickle when it is installed; None when neither can."""
    dumps: list[Callable[[Any], bytes]] = [pickle.dumps]
    try:
        import cloudpickle  # type: ignore[import-untyped, import-not-found, unused-ignore]  # optional
        dumps.append(cloudpickle.dumps)
    except ImportError:
        pass
    for dump in dumps:
        try:
            return pickle.dumps((list(sys.path), dump(factory)))
        except Exception:  # noqa: S112  # unpicklable (a closure over a lock): try the next
            continue
    return None


def check_fingerprint_stable(agent_factory: AgentFactory, run: Trajectory | None = None, *,
                             timeout: float = 300.0) -> bool:
    """``fingerprint()`` names the agent the same way wherever it is built: it is JSON with no
    memory address in it, two agents from ``agent_factory`` give one digest, and an agent the
    factory builds in a fresh Python interpreter (another hash seed, so set order and
    ``hash()`` differ) gives that digest too. Returns whether the other interpreter was used:
    False when the factory cannot be sent there (a closure over something unpicklable) or
    cannot build an agent there, after the checks in this process passed."""
    a, b = agent_of(agent_factory()), agent_of(agent_factory())
    if Capability.FINGERPRINT not in capabilities(a):
        return False
    value = cast(FingerprintedAgent, a).fingerprint()
    check_json(value, "the agent's fingerprint()")
    probe = run
    found = _ADDRESS.search(canonical(value))
    if found:
        fail("fingerprint", f"the fingerprint names a memory address ({found.group(0)!r}), "
                            "which differs from process to process", probe,
             hint="describe tools and nodes by name, never by repr() or id()")
    here = agent_fingerprint(a)
    if agent_fingerprint(b) != here:
        fail("fingerprint", "two agents built by the same factory give different fingerprints",
             probe, hint="fingerprint() must depend only on the agent's graph, tools and "
                         "prompts, never on when or where it was built")
    payload = _shipped(agent_factory)
    if payload is None:
        return False
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    done = subprocess.run([sys.executable, "-c", _CHILD], input=payload, capture_output=True,
                          timeout=timeout, env=env, check=False)
    lines = [line for line in done.stdout.decode(errors="replace").splitlines()
             if line.startswith(_MARK)]
    if not lines:
        return False  # the factory could not build an agent there (a fixture's state, say)
    there = lines[-1][len(_MARK):].strip()
    if there != here:
        fail("fingerprint", f"the fingerprint is {here} in this process and {there} in a fresh "
                            "interpreter", probe,
             hint="fingerprint() must not depend on the process: sort sets, never use hash(), "
                  "id() or repr() of objects")
    return True
