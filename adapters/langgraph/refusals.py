"""Every shape of run, step or plan a LangGraph branch cannot reproduce faithfully, refused by
name before anything is written to the checkpointer.

``refuse_run`` checks a run once, before its first branch: each step must have been decided by
a model node of a graph level CAR can fork into, from checkpoints that still hold what it
decided from (``refuse_step``), and the tasks of each superstep must be ones a fork can hold
apart. A run whose thread the checkpointer does not hold is branched from fork points rebuilt
from the record where it holds their state (``rebuild``), and refused by name where not.
``refuse_branch`` checks one branch: its step's checkpoints and what the plan asks of it.
``refuse_unknown_tools`` checks the agent's own parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph.prebuilt.tool_node import INVALID_TOOL_NAME_ERROR_TEMPLATE

from car_core.contract import Trajectory, redact
from car_core.errors import (
    AdapterError,
    InvalidInput,
    InvalidIntervention,
    StepOutOfRange,
)

from ..common.messages import calls_of, takes_state
from .checkpoints import carried_writes, checkpoint_map, recast, task_at, thread_config
from .messages import to_dicts
from .model import CarChatModel
from .plan import BranchPlan
from .rebuild import Rebuild, plan_rebuild
from .shape import AppShape
from .step_meta import builds_input, is_send_task
from .undecided import refuse_undecided


def refuse_unknown_tools(tools: list[str], given: Mapping[str, list[str]]) -> None:
    """Refuse any tool name, in any parameter, that no tool of the graph has: a typo would
    leave the real tool unguarded on every branch."""
    unknown = {param: sorted(set(names) - set(tools))
               for param, names in given.items() if set(names) - set(tools)}
    if unknown:
        where = "; ".join(f"side-effect tool(s) {names} are not tools of this graph"
                          if param == "side_effect_tools" else
                          f"{param} names {names}, which are not tools of this graph"
                          for param, names in unknown.items())
        raise InvalidInput(f"{where}; its tools are {tools}",
                           hint="spell each name exactly as the tool is registered; a tool "
                                "a node reaches in a way CAR cannot see (built inside the "
                                "node function) is passed itself: node_tools=[the_tool]")


def refuse_persistent_subgraphs(shape: AppShape) -> None:
    """Refuse an app with a subgraph compiled with ``checkpointer=True``: it keeps memory of its
    own across invocations, in a namespace of its own the fork of a step does not copy, and its
    task ids are not in the parent's checkpoints. A user trial's branch from before such a
    subgraph ran it with no memory and CAR said no step caused the failure; one from inside it
    skipped it and replayed its recorded output (a rescue of 1 at a step never re-decided)."""
    kept = sorted(ns for ns, g in shape.graphs.items()
                  if ns and getattr(g, "checkpointer", None) is True)
    if kept:
        raise AdapterError(
            f"subgraph(s) {[recast(ns) for ns in kept]} are compiled with checkpointer=True "
            "(memory of their own across invocations), which a branch cannot fork: it would "
            "run them without that memory, or skip them", hint="compile each without "
            "checkpointer= so it runs on the parent's checkpointer (keep what it must remember "
            "across invocations in the parent's state), or attribute the subgraph as an app of "
            "its own")


def refuse_run(shape: AppShape, run: Trajectory,
               undecided: list[tuple[str, str, str]] | None, safety: Any = None,
               routing: frozenset[str] = frozenset()) -> Rebuild | None:
    """Refuse a run whose steps this app cannot fork into, naming the shape and the node.
    ``undecided``: the nodes calling models CAR does not decide, when CAR decides the others
    (None: CAR decides none). ``safety``: the agent's ``ToolSafety``, to refuse a guarded tool
    whose recorded ``Command`` wrote state no record answer can write back. ``routing``: the
    calls a node answers itself that may run live (``refuse_unguarded_calls``). A run whose thread
    the checkpointer does not hold gives how its fork points are rebuilt from the record
    (``rebuild``; ``CheckpointsMissing`` where they cannot be); any other gives None."""
    if run.meta.get("framework") != "langgraph":
        raise AdapterError("this run was not recorded from a LangGraph app", run_id=run.id,
                           hint="record it with CarCallback or import_thread")
    if safety is not None:
        refuse_state_writers(run, safety)
    thread_id = run.meta.get("thread_id")
    # recorded without a checkpointer, or an InMemorySaver of the process that recorded the
    # run: rebuilt from the record below
    missing = thread_id is None or shape.saver.get_tuple(thread_config(str(thread_id))) is None
    if undecided is not None:
        refuse_undecided(run, undecided)
    groups: dict[tuple[str, str], dict[str, list[int]]] = {}  # checkpoint -> task -> steps
    for i, step in enumerate(run.steps):
        cmap = checkpoint_map(step.meta)
        _refuse_step_shape(shape, run, i, cmap)
        for level, cid in cmap.items():
            groups.setdefault((level, str(cid)), {}).setdefault(
                task_at(step.meta, level), []).append(i)
    # the tasks' shape before each step's checkpoint: a second model call in a node's task
    # (LLMToolSelectorMiddleware's) decides from no checkpoint of its own, and an audit read
    # "the run comes from a different graph or thread" of the very app and thread
    for (level, _), by_task in groups.items():
        refuse_superstep(run, level, by_task)
    for i in range(len(run.steps)):
        refuse_step(shape, run, i, rebuilt=missing)  # every step, before any branch runs
    refuse_unguarded_calls(shape, run, routing)  # after the shape: another graph's says so
    if missing:
        return plan_rebuild(shape, run)
    parallel = {key for key, by_task in groups.items() if len(by_task) > 1}
    for k, step in enumerate(run.steps):  # a Send worker held by its writes must have some
        for ns, cid in checkpoint_map(step.meta).items():
            source = (shape.saver.get_tuple(thread_config(str(thread_id), cid, ns))
                      if (ns, str(cid)) in parallel else None)
            if source is not None:
                carried_writes(run, k, ns, source)
    return None


def refuse_unguarded_calls(shape: AppShape, run: Trajectory,
                           routing: frozenset[str] = frozenset()) -> None:
    """Refuse a run with a tool call the app answered in a way no guard can answer on a branch:
    the call's tool is not one of the graph's (a ``ToolNode``'s, or one a node's code reaches),
    or it is known only from ``node_tools`` and the record does not show a LangChain tool of
    that name ran (``meta["tools_run"]``, which ``CarCallback`` keeps; an imported thread
    cannot show it). Such a call was run by a node's own code (memory-agent's
    ``store_memory`` awaits the plain ``upsert_memory`` function), so a branch would run it
    for real: a user trial's guarded ``node_tools=[tool(upsert_memory)]`` wrote 16 real
    memories, 17 unclassified, and 6 through an imported thread. ``routing``: the calls the
    user says a node answers with code that only routes or reads (the customer-support
    tutorial's ``ToFlightBookingAssistant``), which branches run live."""
    ran = run.meta.get("tools_run")
    ran = {str(t) for t in ran} if isinstance(ran, list) else None
    graph = shape.graph_tools
    for k, step in enumerate(run.steps):
        answers = {m.get("tool_call_id"): m.get("content") for m in step.observation or ()
                   if isinstance(m, Mapping)} if isinstance(step.observation, list) else {}
        for cid, name, _ in calls_of(step.action):
            if (cid not in answers or name in graph or name in routing
                    or _turned_away(name, answers[cid])):
                continue
            if name not in shape.tools:
                raise AdapterError(
                    f"step {k}'s call of tool {name!r} was answered, but {name!r} is not a "
                    f"tool of this graph (its tools are {sorted(shape.tools)}): a node's own "
                    "code answered it, and on a branch that code would run it for real",
                    run_id=run.id, hint=_CALL_A_TOOL.format(name=name))
            if ran is None or name not in ran:
                seen = ("no LangChain tool named {0!r} ran in the record" if ran is not None
                        else "an imported thread does not show whether a LangChain tool "
                             "named {0!r} ran").format(name)
                raise AdapterError(
                    f"step {k}'s call of {name!r} was answered by a node, and {seen}: if the "
                    "node calls the function itself, no guard can answer it on a branch, so "
                    "it would run for real", run_id=run.id,
                    hint=_CALL_A_TOOL.format(name=name) + (
                        "" if ran is not None else
                        "; record the run with CarCallback, which notes the tools that ran"))


def _turned_away(name: str, content: Any) -> bool:
    """A ``ToolNode``'s answer to a call of a tool it does not have (a name the model made
    up): it ran nothing, and on a branch it runs nothing either."""
    head = INVALID_TOOL_NAME_ERROR_TEMPLATE.split("{available_tools}")[0]
    return isinstance(content, str) and content.startswith(head.format(requested_tool=name))


_CALL_A_TOOL = ("have the node run it as a LangChain tool (`await {name}_tool.ainvoke(args)` "
                "on a @tool, or a ToolNode), pass that object as node_tools=[...] and "
                "classify it (safe_tools= or side_effect_tools=), then record the run again; "
                "if the node's code only routes or reads (a handoff schema such as the "
                "customer-support tutorial's ToFlightBookingAssistant), pass "
                "routing_calls=[{name!r}] and branches run that node live")


def refuse_state_writers(run: Trajectory, safety: Any) -> None:
    """Refuse a run in which a side-effect tool returned a ``Command`` that wrote graph state
    besides its tool message (``meta["state_writing_tools"]``, recorded by ``CarCallback``;
    absent: not known, not refused) the record cannot replay, unless a simulator answers it: a
    branch's identical call answered from the record would get the message but not the write.
    The record replays a tool's writes when every one was kept as JSON
    (``meta["state_writes"]``; absent, in older records: none). A simulator that takes only
    the arguments cannot write state either: it answers every call the record does not
    replay (the rescues among them), so it is refused too."""
    named = [str(t) for t in run.meta.get("state_writing_tools") or ()]
    writes = [w for w in (run.meta.get("state_writes") or {}).values() if isinstance(w, Mapping)]
    kept = {str(w.get("tool")) for w in writes} - {
        str(w.get("tool")) for w in writes if not isinstance(w.get("update"), Mapping)}
    blind = sorted(t for t in named if safety.guards(t) and t in safety.simulators
                   and not takes_state(safety.simulators[t]))
    if blind:  # any call the record does not replay goes to it, and gets no write
        raise AdapterError(
            f"side-effect tool {blind[0]!r} returned a Command that wrote graph state in the "
            f"record, and the simulator of {blind[0]!r} takes only the arguments, so a "
            "branch's call it answers would get a message but not that state write (an "
            "audit's outcome then read the key as missing on every rescued branch)",
            run_id=run.id,
            hint=f"pass simulators={{{blind[0]!r}: fn(arguments, ctx)}} returning the Command "
                 "the tool would (ctx['tool_call_id'] answers the call)")
    bare = sorted(t for t in named
                  if safety.guards(t) and t not in safety.simulators and t not in kept)
    if bare:
        raise AdapterError(
            f"side-effect tool(s) {bare} returned a Command that wrote graph state besides "
            "the tool message in the record, which the record does not hold as JSON; a "
            "branch's call answered from the record would get the message but not that state "
            "write", run_id=run.id,
            hint=f"pass simulators={{{bare[0]!r}: fn(arguments, ctx)}} returning the Command "
                 "the tool would (ctx['tool_call_id'] answers the call), or name it in "
                 "safe_tools if it has no real side effect")


def _refuse_step_shape(shape: AppShape, run: Trajectory, i: int, cmap: Mapping[str, str]
                       ) -> None:
    """Refuse a step that is not a model decision of a node of a graph level CAR forks."""
    meta = run.steps[i].meta
    node, ns = meta.get("node"), meta.get("checkpoint_ns") or ""
    if not cmap:
        raise AdapterError(
            f"step {i} (a model call in node {node!r}) ran outside any graph task "
            "with a checkpoint — a model called inside a tool, or a graph without "
            "checkpoints — so no branch can start there", run_id=run.id, step=i,
            hint="call models from graph nodes; tools that call models are not forked")
    graph = shape.graphs.get(recast(ns))
    if graph is None:
        raise AdapterError(
            f"step {i} was decided inside subgraph {recast(ns)!r} (node {node!r}), "
            "which this app does not expose as a subgraph", run_id=run.id, step=i,
            hint="add the compiled subgraph as a node, or call it from a node "
                 "function, so it inherits the parent's checkpointer; an agent written with "
                 "the Functional API (@entrypoint / @task) is not a graph CAR can fork: "
                 "build that agent as a StateGraph (create_agent, or nodes and edges)")
    if node not in graph.nodes:
        where = f"subgraph {recast(ns)!r}" if ns else "this graph"
        raise AdapterError(
            f"step {i} was decided by node {node!r}, which {where} does not have: "
            "either the run comes from a different graph, or the model ran in a "
            "subgraph that keeps no checkpoints (compiled with checkpointer=False, or "
            "with its own checkpointer)", run_id=run.id, step=i,
            hint="use the app the run was recorded with; compile subgraphs without "
                 "checkpointer= so they inherit the parent's")
    if (recast(ns), node) in shape.tool_nodes:
        raise AdapterError(f"step {i} is not a model decision of a graph node: it "
                           f"ran in tool node {node!r} (a model called inside a "
                           "tool)", run_id=run.id, step=i,
                           hint="intervene on a step whose action a model node wrote")


def refuse_superstep(run: Trajectory, level: str, by_task: Mapping[str, list[int]]) -> None:
    """Refuse the tasks of one superstep (scheduled from one checkpoint at ``level``) that no
    fork can hold apart: several model calls in one task, or parallel tasks other than
    ``Send`` tasks that each make one model call in the task itself."""
    def own(i: int) -> bool:
        return (run.steps[i].meta.get("checkpoint_ns") or "") == level

    for steps in by_task.values():
        if len(steps) > 1 and any(own(i) for i in steps):
            node = run.steps[steps[1]].meta.get("node")
            raise AdapterError(
                f"node {node!r} made several model calls in one task (steps {steps[0]} and "
                f"{steps[1]}); forking at the later one would re-run the earlier one",
                run_id=run.id, step=steps[1], hint="make one model call per node run: split "
                "the node, or attribute the agent built without middleware that calls a model "
                "of its own (LLMToolSelectorMiddleware's tool choice)")
    if len(by_task) < 2:
        return
    first, second = sorted(steps[0] for steps in by_task.values())[:2]
    nodes = sorted({str(run.steps[i].meta.get("node")) for s in by_task.values() for i in s})
    inner = next((i for s in by_task.values() for i in s if not own(i)), None)
    if inner is not None:
        raise AdapterError(
            f"steps {first} and {second} ran in parallel tasks of one superstep (nodes "
            f"{nodes}), and step {inner} was decided inside a subgraph one of them runs (a Send "
            "fan-out or parallel branches into subgraphs): their checkpoints interleave, so no "
            "fork can hold one task apart from the others", run_id=run.id, step=inner,
            hint="send to plain nodes that call the model themselves, or run the subgraphs one "
                 "superstep at a time")
    pull = next((s[0] for s in by_task.values() if not is_send_task(run.steps[s[0]].meta)), None)
    if pull is not None:
        raise AdapterError(
            f"steps {first} and {second} are model calls scheduled from the same checkpoint "
            f"in parallel (nodes {nodes}: several model nodes in one superstep, not Send "
            "tasks); forking one of them would re-run the other", run_id=run.id, step=pull,
            hint="run model nodes one superstep at a time, or fan out with Send")


def refuse_step(shape: AppShape, run: Trajectory, k: int, rebuilt: bool = False) -> None:
    """Refuse a step this app cannot fork at: out of range, a checkpoint it was scheduled from
    deleted, or a checkpoint whose messages are not those the step decided from (``rebuilt``:
    the run's fork points are rebuilt from the record, checked there). A step whose
    task built its model input (``builds_input``: a ``Send`` payload, a summarizer's prompt)
    decided from that input, not from the checkpoint's messages: the fork re-runs its node on
    the checkpoint, which builds it again, so there is no message list to compare."""
    if not 0 <= k < len(run.steps):
        raise StepOutOfRange(f"step {k} does not exist; the run has {len(run.steps)} steps",
                             run_id=run.id)
    if rebuilt:
        return
    step = run.steps[k]
    thread_id = str(run.meta.get("thread_id"))
    for ns, cid in checkpoint_map(step.meta).items():
        if shape.saver.get_tuple(thread_config(thread_id, cid, ns)) is None:
            raise AdapterError(f"checkpoint {cid} of thread {thread_id!r} (namespace "
                               f"{ns!r}) was deleted", run_id=run.id, step=k,
                               hint="the run cannot be forked there; record it again")
    ns = step.meta.get("checkpoint_ns") or ""
    snapshot = shape.saver.get_tuple(thread_config(thread_id, step.meta["checkpoint_id"], ns))
    values = snapshot.checkpoint["channel_values"].get(shape.messages_key) or []
    # the record holds the messages with every secret removed (``redact.scrub``): a run
    # whose user pasted a key read as "a different graph" and could not be attributed
    if not builds_input(step) and redact.scrub(to_dicts(values)) != step.state:
        raise AdapterError(f"the checkpoint step {k} was scheduled from does not match the "
                           "record: the run comes from a different graph or thread",
                           run_id=run.id, step=k,
                           hint="use the app and thread the run was recorded with")


def refuse_branch(shape: AppShape, run: Trajectory, plan: BranchPlan, model: Any,
                  rebuilt: bool = False) -> None:
    """Refuse a branch of ``run`` under ``plan`` that the app cannot run faithfully: its step
    (``refuse_step``), or a plan that needs CAR to decide the model calls (``model``: the
    ``CarChatModel`` or ``CarMiddleware`` given, or None), a policy that is no chat model,
    forced tool results without a ``ToolNode``, a forced input or action on a ``Send``
    task that only ``CarChatModel`` can reach, or a forced structured answer of
    ``create_agent`` that only CAR deciding the call can have parsed
    (``refuse_structured_answer``)."""
    k = plan.start
    refuse_step(shape, run, k, rebuilt)
    if plan.needs_control and model is None:
        raise AdapterError(
            "holding steps after the branch step or swapping the policy needs CAR to "
            "decide the app's model calls", run_id=run.id, step=k,
            hint="add CarMiddleware() to create_agent(..., middleware=[...]), or build "
                 "the app with CarChatModel(inner=your_model); pass that object as "
                 "LangGraphAgent(app, model=...)")
    if plan.policy is not None and not hasattr(plan.policy[1], "_generate"):
        raise InvalidIntervention("do_policy on a LangGraph agent takes a LangChain chat "
                                  "model", run_id=run.id, step=plan.policy[0],
                                  hint="pass do_policy(k, SomeChatModel(...))")
    if plan.policy is not None:  # the swapped-in model's key, headers and URL userinfo, as
        redact.register_from(plan.policy[1])  # CarChatModel registers its inner model's
    if plan.observations and not shape.tool_nodes:
        raise AdapterError("do_observation needs the graph's tools to run in a ToolNode, "
                           "whose calls carry the ids the forced results answer",
                           run_id=run.id, step=min(plan.observations),
                           hint="run the graph's tools through langgraph.prebuilt.ToolNode")
    step = run.steps[k]
    if k in plan.actions and model is None:
        refuse_structured_answer(shape, run, k, plan.actions[k])
    if builds_input(step) and plan.changes_start and not _decided_at_call(shape, step, model):
        node = step.meta.get("node")
        if is_send_task(step.meta):
            # CarMiddleware only sees create_agent's model node, never a Send worker's call
            raise AdapterError(
                f"step {k} ran in a Send task of node {node!r}: its input is the Send payload "
                "and its output goes to the task's own writes, so do_action / do_observation / "
                "do_context there need CAR to decide the model call", run_id=run.id, step=k,
                hint="build the app with CarChatModel(inner=your_model) and pass it as "
                     "LangGraphAgent(app, model=...); do_resample works without it")
        # the summarizer's example only where the node is one: a trial's planner node, which
        # writes its own prompt, was pointed at a SummarizationMiddleware it did not have
        summarizer = "summariz" in str(node).lower()
        raise AdapterError(
            f"step {k} is a model call whose whole input node {node!r} built itself (its own "
            "prompt, not the graph's messages), and whose output the node turns into what it "
            "writes, so do_action / do_context there can only be applied at the model call, "
            "which CAR does not decide", run_id=run.id, step=k,
            hint=("wrap that node's model in CarChatModel(inner=...) ("
                  + ("e.g. SummarizationMiddleware(model=CarChatModel(inner=summarizer))"
                     if summarizer else f"the model node {node!r} calls")
                  + "), have CAR decide the app's other model calls too (CarMiddleware() on "
                  "create_agent, or CarChatModel), and pass that object as "
                  "LangGraphAgent(app, model=...), then record the run again; do_resample "
                  "works there without it"))


def refuse_structured_answer(shape: AppShape, run: Trajectory, k: int, action: Any) -> None:
    """Refuse forcing ``action`` at step ``k`` without CAR deciding the model call where
    ``create_agent``'s model node would parse it into ``structured_response`` (a call of one of
    its structured-output tools, or a text answer where it may use a provider's structured
    output): written as the node's output, the forced action skips that parsing, so the
    branch's structured response would not be the forced answer (the model node, seeing a
    schema call unanswered, would even call the model again, live)."""
    meta = run.steps[k].meta
    node = meta.get("node")
    reached = shape.reaches.get((recast(meta.get("checkpoint_ns") or ""), str(node)))
    if reached is None or not (reached.structured or reached.answers_in_text):
        return
    calls = action.get("tool_calls") if isinstance(action, Mapping) else None
    names = {str((c.get("function") or {}).get("name")) for c in calls or ()
             if isinstance(c, Mapping)}
    parsed = sorted(names & reached.structured)
    if not parsed and (names or not reached.answers_in_text):
        return  # a real tool call, or text a tool strategy's node writes as it is
    what = (f"its call of {parsed[0]!r}" if parsed else
            "its text answer (a provider's structured output)")
    raise AdapterError(
        f"step {k} is create_agent's structured answer: node {node!r} parses {what} into "
        "structured_response, and without CAR deciding the model call a forced action is "
        "written as the node's output, past that parsing, so the branch would never get the "
        "forced answer as its structured_response (the model would answer again, live)",
        run_id=run.id, step=k,
        hint="add CarMiddleware() to create_agent(..., middleware=[...]) and pass that same "
             "object as LangGraphAgent(app, model=...): the forced answer is then the model "
             "call's, parsed as the app parses it; do_resample works there without it")


def edit_reaches_call(step: Any, model: Any) -> bool:
    """Whether an edited system prompt or edited tool descriptions reach ``step``'s model call
    on a branch: CAR decided that call when it was recorded (``CarChatModel`` or
    ``CarMiddleware``; both give the call the whole input and the tools a branch hands them)
    and decides the app's calls here (``model=``)."""
    return model is not None and step.meta.get("car_decided") is True


def _decided_at_call(shape: AppShape, step: Any, model: Any) -> bool:
    """Whether a ``CarChatModel`` decides ``step``'s model call on a branch, so a forced action
    or input given to CAR reaches that call (``CarMiddleware`` decides only create_agent's
    model node, from the graph's messages): ``model=`` is one, or, with ``model=`` given (every
    model call CAR's, ``undecided``), the step's node reaches no model but CAR-wrapped ones."""
    if isinstance(model, CarChatModel):
        return True
    if model is None or is_send_task(step.meta) or step.meta.get("car_decided") is not True:
        return False
    reached = shape.reaches.get((recast(step.meta.get("checkpoint_ns") or ""),
                                 str(step.meta.get("node"))))
    return reached is not None and reached.wrapped and not reached.models
