"""A LangGraph app whose refund tool raises on branches: the LangGraph adapter lets the graph's
error out of ``branch``, so such a branch is a failure, never an outcome. A few are left out,
counted and shown; when every branch that reaches the tool crashes, the estimate refuses."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from car_adapters.demo import support_agent as sa
from car_adapters.langgraph import CarCallback, CarChatModel, LangGraphAgent
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver

import car_core as car
from car_core.engine.execution import Sequential
from car_core.errors import BranchesFailed
from car_core.report import render_attribution


class PaymentsHook:
    """The payment provider's sandbox, down for branches: calls ``down`` (a set of call
    numbers among the branches' refund calls, or ``all``) raise."""

    def __init__(self) -> None:
        self.armed = False
        self.down: set[int] | str = "all"
        self.calls = 0

    def check(self) -> None:
        if not self.armed:
            return
        self.calls += 1
        if self.down == "all" or self.calls in self.down:
            raise RuntimeError("payments sandbox unavailable")


HOOK = PaymentsHook()


def first_failure(app: Any) -> Any:
    """The first ticket of the support app that refunds (p = 0.3 each; the model's rng is
    seeded, so it is the same ticket every time), recorded by a callback."""
    cb = CarCallback()
    for i in range(50):
        app.invoke(sa.inputs(), {"configurable": {"thread_id": f"user-{i}"}, "callbacks": [cb]})
        if sa.outcome(cb.run):
            break
    return cb.run


@tool
def issue_refund(order_id: str, amount: float) -> str:
    """Refund an order (moves money: a side effect)."""
    HOOK.check()
    return json.dumps({"refunded": order_id, "amount": amount})


@pytest.fixture
def support() -> Any:
    HOOK.armed, HOOK.down, HOOK.calls = False, "all", 0
    model = sa.PlantedSupportModel(rng_seed=0)
    wrapper = CarChatModel(inner=model)
    app = sa.build_app(wrapper, InMemorySaver(),
                       tools=[sa.lookup_order, sa.record_decision, issue_refund])
    run = first_failure(app)
    assert sa.outcome(run) and len(run.steps) == 4  # lookup, decide refund, refund, reply
    HOOK.armed = True
    # the refund goes to a payments sandbox: safe to run on branches, where it may fail
    yield LangGraphAgent(app, model=wrapper, safe_tools=[*sa.SAFE_TOOLS, "issue_refund"]), run
    HOOK.armed = False


def test_a_branch_whose_tool_raises_is_counted_and_shown_not_scored(support: Any,
                                                                    store: Any) -> None:
    agent, run = support
    HOOK.down = {1, 2}  # the first branch that refunds, and its retry
    res = car.contrastive(run, agent, outcome=sa.outcome, rollouts=32, seed=0, store=store,
                          search="full", executor=Sequential(), progress=False)
    (failure,) = res.failures
    assert "payments sandbox unavailable" in failure["error"] and failure["attempts"] == 2
    # left out of the arms, not scored as a rescue (the crashed branch issued no refund)
    assert sum(a.n for a in res.arms) == res.rollouts_used - 1
    assert not any(b["arm"] == failure["arm"] and b["rollout"] == failure["rollout"]
                   for b in store.branches(res.attribution_id))
    assert res.locus == 1
    assert "1 failed branch(es) left out" in str(res)
    assert "1 failed branch(es) left out of the estimate" in render_attribution(res, run=run)


def test_a_tool_that_raises_on_every_branch_stops_the_estimate(support: Any) -> None:
    agent, run = support
    with pytest.raises(BranchesFailed, match="payments sandbox unavailable") as info:
        car.contrastive(run, agent, outcome=sa.outcome, rollouts=32, seed=0,
                        executor=Sequential(), progress=False)
    err = info.value
    assert err.failures and all(f.attempts == 2 for f in err.failures)
    # only branches that decide step 2 (the refund) live reach the tool
    assert all(f.task.plan.start <= 2 for f in err.failures)


class OrdersHook:
    """The orders database, unreachable where the estimate runs: while ``down``, the lookup
    tool raises ``ToolException`` with ``said``, which the tool turns into an error result the
    model reads (``status="error"``), as an MCP tool's error comes back: the graph does not
    raise."""

    down = False
    said = "orders database unreachable"
    only: str | None = None  # the one order it errors for while down (None: every order)


@tool("lookup_order")
def flaky_lookup(order_id: str) -> str:
    """Look up an order (reads only: safe on branches)."""
    if OrdersHook.down and OrdersHook.only in (None, order_id):
        raise ToolException(OrdersHook.said)
    return str(sa.lookup_order.invoke({"order_id": order_id}))


flaky_lookup.handle_tool_error = True  # the error goes back to the model, as MCP tools do


class GivesUpOnErrors(sa.PlantedSupportModel):
    """The planted support model, which apologises instead of deciding when the lookup fails
    (an error result, or a result that says "Error")."""

    def decide(self, messages: Any) -> Any:
        last = next((m for m in reversed(messages) if isinstance(m, ToolMessage)), None)
        if last is not None and (last.status == "error"
                                 or str(last.content).startswith("Error")):
            return AIMessage("Sorry, I cannot reach our orders system right now.")
        return super().decide(messages)


@tool("lookup_order")
def lookup_saying_its_outage(order_id: str) -> str:
    """Look up an order; while the database is down, say so in the result (reads only)."""
    if OrdersHook.down:
        return "Error: orders service unavailable (503), try again later"
    return str(sa.lookup_order.invoke({"order_id": order_id}))


@pytest.mark.parametrize(("lookup", "said"), [
    (flaky_lookup, "orders database unreachable"),
    (lookup_saying_its_outage, "orders service unavailable (503)")])
def test_a_safe_tool_that_errors_only_on_branches_is_never_scored(lookup: Any,
                                                                   said: str) -> None:
    """A read-only tool that answered in the record and answers the same call with an error on
    branches (its service down where the estimate runs): the agent, told of the error, gives
    up, which a scored branch would count as a rescue of the step re-decided (the lookup,
    whose rescue is 0: step 0 came out "also mattered" at about 0.3). Each such branch is a
    failure instead, and with all of them failing the estimate refuses, naming the tool. So
    it is when the tool returns its outage as text instead of raising: a user trial's hotel
    search returned "Error: hotel search service unavailable (503)", the agent apologised,
    and CAR said re-deciding the search rescued 65% (the truth: 0)."""
    OrdersHook.down = False
    wrapper = CarChatModel(inner=GivesUpOnErrors(rng_seed=0))
    app = sa.build_app(wrapper, InMemorySaver(),
                       tools=[lookup, sa.record_decision, issue_refund])
    run = first_failure(app)
    assert sa.outcome(run) and len(run.steps) == 4
    agent = LangGraphAgent(app, model=wrapper, safe_tools=["lookup_order", "record_decision"],
                           side_effect_tools=["issue_refund"])
    OrdersHook.down = True
    try:
        with pytest.raises(BranchesFailed, match="safe tool 'lookup_order' ran live at step 0 "
                                                 "and returned an error") as info:
            car.contrastive(run, agent, outcome=sa.outcome, rollouts=32, seed=0,
                            search="full", executor=Sequential(), progress=False)
    finally:
        OrdersHook.down = False
    failures = info.value.failures
    # only the branches that re-decide the lookup call it live; the tool's own words are kept
    assert failures and all(f.task.plan.start == 0 for f in failures)
    assert all(said in f.error for f in failures)


class AsksAnotherOrder(GivesUpOnErrors):
    """Looks up another order than the ticket's while the orders database is down (the
    branches), so no recorded call answers the same arguments."""

    def decide(self, messages: Any) -> Any:
        msg = super().decide(messages)
        for c in getattr(msg, "tool_calls", None) or ():
            if c["name"] == "lookup_order" and OrdersHook.down:
                c["args"] = {**c["args"], "order_id": "O-999"}
        return msg


@pytest.mark.parametrize(("said", "scored"), [("fare service unavailable (503)", False),
                                              ("no order O-999 on this account", True)])
def test_an_outage_for_a_call_the_record_never_made_is_never_scored(said: str,
                                                                   scored: bool) -> None:
    """A user trial's search tool answered every branch's new call with "fare service
    unavailable (503)" and the whole rescue rested on those branches, silently: an error for
    arguments the record never used was taken for the agent's own doing. An error that blames
    the service fails the branch (all of them: the estimate refuses, naming it); one that
    blames the call (an unknown order, while the recorded order is still found) is still what
    re-deciding the step does, and scored."""
    OrdersHook.down, OrdersHook.said = False, said
    OrdersHook.only = "O-999" if scored else None
    wrapper = CarChatModel(inner=AsksAnotherOrder(rng_seed=0))
    app = sa.build_app(wrapper, InMemorySaver(),
                       tools=[flaky_lookup, sa.record_decision, issue_refund])
    run = first_failure(app)
    agent = LangGraphAgent(app, model=wrapper, safe_tools=["lookup_order", "record_decision"],
                           side_effect_tools=["issue_refund"])
    OrdersHook.down = True
    try:
        if scored:
            dist = car.intervene(run, agent, car.do_resample(0), outcome=sa.outcome,
                                 rollouts=4, seed=0, executor=Sequential(), progress=False)
            assert dist.failures == () and len(dist.values) == 4
        else:
            with pytest.raises(BranchesFailed, match="safe tool 'lookup_order' ran live at "
                                                     "step 0 and returned an error that says "
                                                     "its service is down") as info:
                car.contrastive(run, agent, outcome=sa.outcome, rollouts=8, seed=0,
                                search="full", executor=Sequential(), progress=False)
            # what to do names the service, not the agent
            assert (info.value.hint or "").startswith("bring that service up where this "
                                                      "estimate runs")
    finally:
        OrdersHook.down, OrdersHook.said = False, "orders database unreachable"
        OrdersHook.only = None


class ServerDown(sa.PlantedSupportModel):
    """The planted support model behind a server that goes away: while ``down``, every call
    fails as an HTTP client's does when the connection is refused."""

    down: bool = False
    raising: ClassVar[type[Exception]] = ConnectionRefusedError

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> Any:
        if ServerDown.down:
            raise ServerDown.raising("connection refused: 127.0.0.1:8765")
        return super()._generate(messages, stop, run_manager, **kwargs)


class RateLimitError(Exception):
    """What openai raises for an HTTP 429 its retries did not outlast (``ChatOpenAI(
    max_retries=0)``), matched by name and status as every client's error is."""

    status_code = 429


def _stop_when_the_server(raising: type[Exception], match: str, intervene: bool = False
                          ) -> Any:
    """The ``ModelUnavailable`` an attribution (or, ``intervene``, an intervention) stops with
    once the model's server raises ``raising`` on every branch (the run recorded while it
    answered)."""
    from car_core.errors import ModelUnavailable

    ServerDown.down, ServerDown.raising = False, raising
    wrapper = CarChatModel(inner=ServerDown(rng_seed=0))
    app = sa.build_app(wrapper, InMemorySaver(),
                       tools=[sa.lookup_order, sa.record_decision, issue_refund])
    run = first_failure(app)
    agent = LangGraphAgent(app, model=wrapper, safe_tools=list(sa.SAFE_TOOLS),
                           side_effect_tools=["issue_refund"])
    ServerDown.down = True
    try:
        with pytest.raises(ModelUnavailable, match=match) as info:
            if intervene:
                car.intervene(run, agent, car.do_resample(0), outcome=sa.outcome, rollouts=4,
                              executor=Sequential())
            else:
                car.contrastive(run, agent, outcome=sa.outcome, rollouts=16, seed=0,
                                executor=Sequential(), progress=False)
    finally:
        ServerDown.down, ServerDown.raising = False, ConnectionRefusedError
    return info.value


def test_a_model_server_down_stops_the_attribution_resumable_as_everywhere() -> None:
    """On LangGraph a model server that went away made every branch fail and be retried, and
    the estimate stopped with "fix the agent (or the hook that raises)": the other adapters
    stop at once with ModelUnavailable, which says to start the server and resume."""
    stop = _stop_when_the_server(ConnectionRefusedError, "connection refused")
    assert "start the server or fix its address, then resume" in (stop.hint or "")


def test_a_model_server_that_rate_limits_is_told_to_slow_down_not_to_start() -> None:
    """A user trial's OpenAI-compatible server answered 429 on a branch (ChatOpenAI with
    max_retries=0): the stop said "start the server or fix its address", though the server was
    up and only rate-limiting. The hint says so, and what to do: wait, retry more, run fewer
    branches at once."""
    hint = _stop_when_the_server(RateLimitError, "RateLimitError").hint or ""
    assert "rate-limiting (429)" in hint and "max_retries" in hint and "concurrency" in hint
    assert "start the server" not in hint and "then resume" in hint


class InternalServerError(Exception):
    """What openai raises for an HTTP 500 its retries did not outlast."""

    status_code = 500


def test_a_model_server_that_answers_500_is_not_told_to_start() -> None:
    """A user trial's server was up and answered "500 upstream overloaded"; the stop said
    "start the server or fix its address". It says the server answered an error."""
    hint = _stop_when_the_server(InternalServerError, "InternalServerError").hint or ""
    assert "answered HTTP 500" in hint and "its logs" in hint
    assert "start the server" not in hint and "then resume" in hint


def test_an_intervention_stopped_by_an_outage_is_told_to_run_again_not_to_resume() -> None:
    """A user trial's `car intervene` was told to "resume the attribution ... --resume ID": an
    intervention keeps nothing to resume, and the command has no --resume."""
    hint = _stop_when_the_server(ConnectionRefusedError, "connection refused",
                                 intervene=True).hint or ""
    assert "start the server or fix its address" in hint
    assert "--resume" not in hint and "resume the attribution" not in hint
    assert "run the intervention again" in hint


@tool
def flaky_refund(order_id: str, amount: float) -> str:
    """Refund an order through a sandbox whose connection drops now and then."""
    FLAKY["calls"] += 1
    if FLAKY["armed"] and FLAKY["calls"] % 3 == 0:
        raise ConnectionError("payments sandbox: connection reset by peer")
    return json.dumps({"refunded": order_id, "amount": amount})


FLAKY = {"armed": False, "calls": 0}


def test_a_live_tools_connection_drop_fails_its_branch_not_the_estimate() -> None:
    """A tool run live whose service drops a connection (past the app's own RetryPolicy) was
    taken for a model server down: every attribution of a user trial's app stopped, and took 28
    resumes. It fails that branch, counted like any other error; the model's outage still
    stops the estimate (the test above)."""
    FLAKY.update(armed=False, calls=0)
    wrapper = CarChatModel(inner=sa.PlantedSupportModel(rng_seed=0))
    app = sa.build_app(wrapper, InMemorySaver(),
                       tools=[sa.lookup_order, sa.record_decision,
                              flaky_refund.model_copy(update={"name": "issue_refund"})])
    run = first_failure(app)
    FLAKY["armed"] = True
    agent = LangGraphAgent(app, model=wrapper, safe_tools=[*sa.SAFE_TOOLS, "issue_refund"])
    calls = FLAKY["calls"]
    dist = car.intervene(run, agent, car.do_action(2, run.steps[2].action), outcome=sa.outcome,
                         rollouts=12, seed=0, executor=Sequential(), progress=False)
    # every third call dropped: 6 branch errors, each tried again on its own path (this model
    # draws CAR's noise), and the estimate ends with every branch
    assert FLAKY["calls"] - calls == 18 and dist.n == 12 and not dist.failures
