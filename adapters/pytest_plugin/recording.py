"""``RunRecorder``, the object behind the ``car_recorder`` fixture.

It starts a recording for every framework the test has loaded, collects the runs when the test
ends, scores the ones their recorder could not score with the outcome given to ``watch``, tags
each with the test's node id (``run.meta["test"]``) and the session's id
(``run.meta["test_session"]``) and saves them to the session's store.
``attribute()`` branches the latest failed run with the agent watched for its framework. It
imports ``car_core`` and the frameworks only when used.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .integrations import Integration, integrations

if TYPE_CHECKING:  # car_core loads only when a test uses the recorder
    from car_core.contract import ExecutorName

_FRAMEWORK_OF_TYPE = (  # where an object's class lives -> run.meta["framework"] of its runs
    ("car_adapters.langgraph", "langgraph"), ("langgraph", "langgraph"),
    ("car_adapters.llamaindex", "llama-index"), ("llama_index", "llama-index"),
    ("car_adapters.openai_agents", "openai-agents"), ("agents", "openai-agents"),
)


def framework_of(obj: Any) -> str | None:
    module = type(obj).__module__ or ""
    for prefix, framework in _FRAMEWORK_OF_TYPE:
        if module == prefix or module.startswith(prefix + "."):
            return framework
    return None


@dataclass
class _Watched:
    obj: Any
    outcome: Callable[..., Any] | None
    options: dict[str, Any]
    framework: str | None


@dataclass
class Attribution:
    """A finished attribution: the result, the run it explains and where its report is."""

    result: Any
    run: Any
    report: Path | None
    nodeid: str
    notes: list[str] = field(default_factory=list)

    def summary(self, seconds: float, explain: bool = False) -> str:
        """The failure report's section: the answer, the run, each step's row and the report;
        how it was measured (the test, its level, the sample sizes) follows with ``explain``
        (``--car-explain``, for a CI log read where the report is not at hand), else one line
        says where it is. Printed always, it repeated the step table below the answer in
        some forty lines per failing test."""
        r = self.result
        lines = [self.headline()]
        lines.append(f"run {self.run.id} ({len(self.run.steps)} steps) recorded by {self.nodeid};"
                     f" {r.rollouts_used} rollouts in {seconds:.1f}s"
                     + (f"; truncated: {r.budget_note}" if r.truncated else ""))
        where = ("how this was measured (test, level, sample sizes, pairing): "
                 + ("in the report, or " if self.report is not None else "")
                 + "add --car-explain")
        # the table and what follows it (its first line is the headline, said above)
        plain = (r.plain(None, instead=False) if explain and hasattr(r, "locus")
                 else r.plain(None if explain else where))
        lines += [*plain.splitlines()[1:], *self.notes]
        if self.report is not None:
            lines.append(f"report: {self.report}")
        if explain:
            lines.append(r.explain(self._who()))
        return "\n".join(lines)

    def continue_command(self) -> str | None:
        """The pytest command that attributes an undecided (or truncated Shapley) test with a
        larger budget: this test again with the budget the result names (``larger_budget``:
        the limit that stopped it doubled, or the rollouts it estimates would decide it). It
        runs the test again and attributes the run that records, so the headline says it
        resumes nothing: an agent that draws CAR's noise records the same run and draws the
        same branches again, but one over a model that ignores its seed records a new run,
        which may not even fail (a user trial took "to continue" for a resume)."""
        if self.result.continue_hint() is None:
            return None
        r = self.result
        more = r.larger_budget()
        flags = ["--car-attribute"]
        if hasattr(r, "locus"):
            flags += ["--car-rollouts", str(r.params.get("rollouts", r.rollouts_cap))]
        else:
            flags += ["--car-method", "shapley"]
        if more.get("rollouts"):
            flags += ["--car-budget", str(more["rollouts"])]
        if more.get("wall_time"):
            flags += ["--car-wall-time", f"{more['wall_time']:g}"]
        return shlex.join(["pytest", self.nodeid, *flags])

    def properties(self) -> dict[str, str]:
        """What the test's report carries for CI (JUnit XML ``<property>`` elements)."""
        from car_core import formatting as fmt
        r = self.result
        props = {"car_headline": self.headline(), "car_run": str(self.run.id),
                 "car_method": "contrastive" if hasattr(r, "locus") else "shapley",
                 "car_rollouts": str(r.rollouts_used)}
        if hasattr(r, "locus"):
            props["car_answer"] = str(r.answer)
            if r.locus is not None:
                s = r.steps[r.locus]
                props.update(car_locus=str(r.locus), car_rescue=fmt.effect(s.effect),
                             car_interval=fmt.effect_interval(s.ci),
                             car_level=f"{r.level:g}")  # for machines: 0.95
        else:
            props["car_answer"] = "truncated" if r.truncated else "valued"
        if self.report is not None:
            props["car_report"] = str(self.report)
        if getattr(r, "attribution_id", None):
            props["car_attribution"] = str(r.attribution_id)  # in the session's store
        return props

    def _who(self) -> str | None:
        """Who decided the step the answer names (the locus, or an undecided candidate)."""
        from car_core.assertions import agent_of
        r = self.result
        if not hasattr(r, "locus"):
            return None
        step = r.locus if r.locus is not None else r.candidate
        return agent_of(self.run, step) if step is not None else None

    def headline(self) -> str:
        """The answer in the plain sentence of every other surface
        (``car_core.formatting.answer``), with who decided the step it names and, when
        undecided or truncated, how to continue."""
        from car_core import formatting as fmt
        again = self.continue_command()
        tail = (f"; to attribute with a larger budget, run the test again (a new run is "
                f"recorded; nothing is resumed): {again}") if again else ""
        said = fmt.answer(self.result, self._who())
        return (said.removesuffix(".") + tail) if tail else said


class NoRunFailed(str):
    """Why a failing test was not attributed, when every run it recorded and scored passed:
    the test failed on something else, which is no undecided answer (the session's summary
    lists such tests apart)."""


class RunRecorder:
    """Records the runs of one test. ``runs`` holds them once the test has finished (or after
    ``finish()``); ``watch`` names the agent to branch with and its outcome function."""

    def __init__(self, nodeid: str, path: Path, options: Mapping[str, Any] | None = None,
                 session: str | None = None) -> None:
        self.nodeid = nodeid
        self.path = path
        self.session = session
        self.options = dict(options or {})
        self.runs: list[Any] = []
        self.notes: list[str] = []
        self.outcome_errors: list[str] = []  # the outcome raised while scoring a recorded run
        self._handles: dict[str, Any] = {}
        self._watched: list[_Watched] = []
        self._finished = False

    def start(self) -> None:
        """Start recording every framework loaded now (idempotent per framework)."""
        for integration in integrations():
            if integration.name not in self._handles and integration.loaded():
                self._start(integration)

    def _start(self, integration: Integration) -> None:
        try:
            self._handles[integration.name] = integration.start()
        except Exception as exc:  # a broken adapter must not break the user's test
            self.notes.append(f"could not record {integration.name} runs: {exc!r}")

    def watch(self, agent: Any, *, outcome: Callable[..., Any] | None = None,
              safe_tools: Iterable[str] = (), side_effect_tools: Iterable[str] = (),
              simulators: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
              **adapter_options: Any) -> Any:
        """Name ``agent`` (a compiled LangGraph app, a LlamaIndex workflow, an OpenAI Agents SDK
        ``Agent`` or any car Agent) as the one to branch this test's runs with; ``outcome(run)``
        scores them (1 / True = the failure happened). Every tool is classified before the
        first branch: ``safe_tools`` run live on branches, side-effect tools never run on a
        branch unless simulated, and a tool in neither (nor annotated by its framework) stops
        the attribution by name unless ``unclassified="live"``. Returns ``agent``."""
        if framework_of(agent) is None and not _is_car_agent(agent):
            from car_core.errors import AdapterError
            raise AdapterError(f"car_recorder.watch() got a {type(agent).__name__}, which CAR "
                               "cannot branch",
                               hint="watch a compiled LangGraph app, a LlamaIndex workflow, an "
                                    "OpenAI Agents SDK Agent or a car Agent (car.FunctionAgent)")
        self.start()  # a framework imported inside the test is recorded from here on
        options = {"side_effect_tools": tuple(side_effect_tools), **adapter_options}
        if safe_tools:
            options["safe_tools"] = tuple([safe_tools] if isinstance(safe_tools, str)
                                          else safe_tools)
        if simulators:
            options["simulators"] = dict(simulators)
        self._watched.append(_Watched(agent, outcome, options, framework_of(agent)))
        return agent

    def hooks_for(self, agent: Any) -> Any:
        """The run hooks to pass to every run of ``agent`` in this test, for a framework that
        takes them per run: ``Runner.run(agent, input, hooks=car_recorder.hooks_for(agent))``
        with the OpenAI Agents SDK. Raises ``AdapterError`` for an agent of another kind."""
        from car_core.errors import AdapterError
        self.start()
        framework = framework_of(agent)
        for integration in integrations():
            if framework is not None and integration.framework == framework:
                hooks = getattr(self._handles.get(integration.name), "hooks", None)
                if hooks is not None:
                    return hooks
        raise AdapterError(f"no run hooks for a {type(agent).__name__}" + _also(self.notes),
                           hint="LangGraph, LlamaIndex and car.record runs are recorded without "
                                "hooks; hooks_for is for OpenAI Agents SDK agents")

    def recording(self, agent: Any, *, run_config: Any = None) -> Any:
        """The OpenAI Agents SDK's recording block for this test's runs of ``agent``
        (``CarRecorder.recording``): ``with car_recorder.recording(agent):`` around the
        ``Runner.run`` calls, which still pass ``hooks=car_recorder.hooks_for(agent)``. An
        app with guardrails is attributable only from runs recorded so, and a trial found
        no way to write it with the fixture."""
        return self.hooks_for(agent).recording(agent, run_config=run_config)

    # -- when the test ends ----------------------------------------------------------------
    def finish(self) -> list[Any]:
        """Stop recording, score, tag and store the runs (once; later calls return them)."""
        if self._finished:
            return self.runs
        self._finished = True
        collected: list[Any] = []
        for name, handle in self._handles.items():
            try:
                handle.stop()
                collected += handle.runs
            except Exception as exc:
                self.notes.append(f"could not collect {name} runs: {exc!r}")
        self.runs = [self._score(r) for r in _dedup(collected)]
        tags = {"test": self.nodeid, **({"test_session": self.session} if self.session else {})}
        self.runs = [replace(r, meta={**r.meta, **tags}) for r in self.runs]
        if self.runs:
            self._save()
        return self.runs

    def _save(self) -> None:
        from car_core.errors import StoreError
        try:
            writer = writer_for(self.path)
            for run in self.runs:
                writer.save(run)
        except (StoreError, OSError) as exc:
            self.notes.append(f"could not store the runs in {self.path}: {exc}")

    def _score(self, run: Any) -> Any:
        if run.outcome is not None:
            return run
        watched = self._watched_for(run)
        fn = (watched.outcome if watched else None) or self.options.get("outcome")
        if fn is None:
            return run
        from car_core.contract import scored
        from car_core.errors import CarError
        try:
            return scored(run, fn)
        except CarError as exc:
            self.outcome_errors.append(f"run {run.id}: {exc}")
            return run

    def _watched_for(self, run: Any) -> _Watched | None:
        framework = (run.meta or {}).get("framework")
        same = [w for w in self._watched if w.framework == framework]
        named = [w for w in same if getattr(w.obj, "name", None) == run.agent]
        found = named or same
        return found[-1] if found else None

    # -- attribution -----------------------------------------------------------------------
    def attribute(self, *, method: str = "contrastive", budget: int = 256, rollouts: int = 16,
                  wall_time: float = 60.0, report: Path | None = None,
                  seed: int = 0, progress: Any = None,
                  executor: ExecutorName | None = None) -> Attribution | str:
        """Attribute the latest failed run; returns the ``Attribution``, or a one-line reason
        when there is nothing to attribute or no agent to branch with."""
        runs = self.finish()
        if not runs:
            return "the test recorded no agent run" + _also(self.notes)
        scored = [r for r in runs if r.outcome is not None]
        if not scored and self.outcome_errors:
            return (f"the outcome raised while scoring {len(self.outcome_errors)} of the "
                    f"{len(runs)} recorded run(s), so none has an outcome (first: "
                    f"{self.outcome_errors[0]})" + _also(self.notes))
        if not scored:
            return (f"none of the {len(runs)} recorded run(s) has an outcome: pass outcome= "
                    f"to car_recorder.watch(...) or to @pytest.mark.car" + _also(self.notes))
        failed = [r for r in scored if r.failed]
        if not failed:
            return NoRunFailed(f"none of the {len(scored)} scored run(s) failed, so the test "
                               "failed on something else" + _also(self.notes))
        run = failed[-1]
        watched = self._watched_for(run)
        if watched is None:
            return (f"no agent to branch run {run.id} with: call car_recorder.watch(app_or_agent,"
                    " outcome=...) in the test")
        outcome = watched.outcome or self.options.get("outcome")
        if outcome is None:
            return f"no outcome to score branches of run {run.id}: pass outcome= to watch()"
        agent = self._agent(watched)
        if agent is None:
            return (f"{type(watched.obj).__name__} is no agent CAR can branch (a compiled "
                    "LangGraph app, a LlamaIndex workflow, an OpenAI Agents SDK Agent or a car "
                    "Agent)")
        import car_core as car
        cap = car.Budget(rollouts=budget, wall_time=wall_time)
        flush_writers()  # the store holds every run the session recorded so far
        with car.RunStore(self.path) as store:
            if method == "shapley":
                result: Any = car.shapley(run, agent, outcome=outcome, budget=cap, seed=seed,
                                          store=store, progress=progress, executor=executor)
            else:
                result = car.contrastive(run, agent, outcome=outcome, rollouts=rollouts,
                                         budget=cap, seed=seed, store=store, progress=progress,
                                         executor=executor)
            # the run's id in the name: a later session with the same store records another
            # run of this test, whose report must not replace this one (a user trial's
            # summary linked a report about a different run)
            named = None if report is None else report.with_name(
                f"{report.stem}-{run.id[:8]}{report.suffix}")
            written = _write_report(result, run, store, named)
        return Attribution(result, run, written, self.nodeid, list(self.notes))

    def _agent(self, watched: _Watched) -> Any:
        options = _merged(self.options, watched.options)
        for integration in sorted(integrations(), key=lambda i: i.name == "car"):
            if integration.name == "car" or integration.loaded():
                agent = integration.to_agent(watched.obj, options)
                if agent is not None:
                    return agent
        return None


_WRITERS: dict[Path, Any] = {}  # store path -> the session's RunWriter for it


def writer_for(path: Path) -> Any:
    """The one ``RunWriter`` this process saves a store's runs through: a test's runs are
    written while the next test runs, and every write is done by ``flush_writers``."""
    writer = _WRITERS.get(path)
    if writer is None:
        from car_core.contract import RunWriter
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = _WRITERS[path] = RunWriter(path)
    return writer


def flush_writers() -> list[str]:
    """Wait for every queued run to be stored; what could not be stored, one line each."""
    return [f"could not store a run in {path}: {err}"
            for path, writer in _WRITERS.items() for err in writer.flush()]


def close_writers() -> list[str]:
    """``flush_writers``, then stop the writers (a session's end)."""
    problems = flush_writers()
    while _WRITERS:
        _WRITERS.popitem()[1].close()
    return problems


def _is_car_agent(obj: Any) -> bool:
    return callable(getattr(obj, "start", None)) and callable(getattr(obj, "branch", None))


def _merged(marker: Mapping[str, Any], watch: Mapping[str, Any]) -> dict[str, Any]:
    """Marker options under the watch call's, safe tools, side-effect tools and simulators
    united."""
    out = {k: v for k, v in marker.items() if k != "outcome"}
    out.update({k: v for k, v in watch.items()
                if k not in ("safe_tools", "side_effect_tools", "simulators")})
    tools = [*marker.get("side_effect_tools", ()), *watch.get("side_effect_tools", ())]
    out["side_effect_tools"] = tuple(dict.fromkeys(tools))
    safe = [*_names(marker.get("safe_tools", ())), *_names(watch.get("safe_tools", ()))]
    if safe:
        out["safe_tools"] = tuple(dict.fromkeys(safe))
    sims = {**(marker.get("simulators") or {}), **(watch.get("simulators") or {})}
    if sims:
        out["simulators"] = sims
    return out


def _names(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value or ())


def _dedup(runs: list[Any]) -> list[Any]:
    """A run both ``car.record`` and a framework recorder saw (``car.record`` of a LangGraph
    agent): keep the scored copy, matched by thread and step count."""
    scored = {((r.meta or {}).get("thread_id"), len(r.steps)) for r in runs
              if r.outcome is not None and (r.meta or {}).get("thread_id")}
    return [r for r in runs if r.outcome is not None
            or ((r.meta or {}).get("thread_id"), len(r.steps)) not in scored]


def _also(notes: list[str]) -> str:
    return f" ({'; '.join(notes)})" if notes else ""


def _write_report(result: Any, run: Any, store: Any, path: Path | None) -> Path | None:
    if path is None:
        return None
    from car_core.report import render_attribution
    aid = result.attribution_id
    branches = list(store.branches(aid)) if aid else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_attribution(result, run=run, branches=branches), encoding="utf-8")
    return path
