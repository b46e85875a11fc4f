"""The pytest plugin, run inside pytest (``pytester``) on small agent test suites.

The LangGraph suite is the planted support agent: its decision step (step 1) follows the
injection with probability 0.3, so for a run that refunded, P(fail | step 1 held) = 1 and
P(fail | step 1 resampled) = 0.3: the locus is step 1 with rescue 0.7. The refund tool is a side
effect: a ledger file counts its real calls, which branches must never add to.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# imported here, once: pytester's in-process runs drop the modules a run imported afterwards
import car_adapters.demo.support_agent  # noqa: F401
import car_adapters.langgraph  # noqa: F401
import car_adapters.llamaindex  # noqa: F401
import car_adapters.openai_agents  # noqa: F401
import langgraph.checkpoint.memory  # noqa: F401
import llama_index.core.agent.workflow  # noqa: F401
import pytest

from integrations_tests.support.plugin_runs import section, session_store, stored_runs

pytestmark = pytest.mark.slow

SUPPORT_SUITE = '''
import json
from pathlib import Path

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from car_adapters.demo import support_agent
from car_adapters.demo.support_agent import PlantedSupportModel, build_app, inputs, outcome

LEDGER = Path("refunds.ledger")


def simulated_refund(arguments):
    return json.dumps({"refunded": arguments.get("order_id"), "simulated": True})


@pytest.fixture
def app(monkeypatch):
    def counted_refund(order_id, amount):
        with LEDGER.open("a") as f:
            f.write(order_id + "\\n")
        return json.dumps({"refunded": order_id, "amount": amount})
    monkeypatch.setattr(support_agent.issue_refund, "func", counted_refund)
    return build_app(PlantedSupportModel(rng_seed=3), InMemorySaver())  # seed 3: it refunds


@pytest.mark.car(safe_tools=["lookup_order", "record_decision"], side_effect_tools=["issue_refund"])
def test_refuses_refund(car_recorder, app):
    car_recorder.watch(app, outcome=outcome, simulators={"issue_refund": simulated_refund})
    result = app.invoke(inputs(), {"configurable": {"thread_id": "t1"}})
    assert "refunded in full" not in result["messages"][-1].content
'''


def test_a_failing_langgraph_test_gets_its_locus_printed_and_a_report(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_support=SUPPORT_SUITE)
    result = pytester.runpytest("--car-attribute", "--car-rollouts", "32", "--car-explain")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "CAR attribution" in out
    # --car-explain: how it was measured follows the answer, the step table not repeated
    # above it, nor what the agent did instead at the locus
    assert out.count("How this was measured (contrastive attribution of run ") == 1
    assert out.count("What the agent did instead at step 1 (") == 1
    # an unnamed graph's steps are labelled by the node that decided them ("LangGraph", the
    # default graph name, would say nothing)
    found = re.search(r"locus: step (\d) \(decided by agent, its \w+ decision\), rescue "
                      r"([+-]\d\.\d{3}) \[([+-]\d\.\d{3}), ([+-]\d\.\d{3})\] at 95%", out)
    assert found, out
    step, _, lo, hi = int(found[1]), float(found[2]), float(found[3]), float(found[4])
    assert step == 1
    # the analytic rescue 0.7 lies in the interval: at the Bonferroni level (0.99 per step
    # here) the interval misses it about once in a hundred runs
    assert lo <= 0.7 <= hi
    report = Path(re.search(r"report: (\S+\.html)", out)[1])
    assert report.is_file()
    (run,) = stored_runs(session_store(pytester))
    assert run.meta["test"] == "test_support.py::test_refuses_refund"
    assert run.failed and run.id in report.read_text(encoding="utf-8")
    # the recorded run refunded once; no branch ran the real refund tool
    assert (pytester.path / "refunds.ledger").read_text().split() == ["A1001"]


def test_car_executor_is_how_the_attribution_runs_its_branches(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first-hour trial's hosted-like model ran one branch at a time under the plugin, which
    hit its wall-time cap at 99 of 256 rollouts, with no option to run them at once."""
    import car_core
    asked: list[object] = []
    original = car_core.contrastive

    def contrastive(*args: object, **kwargs: object) -> object:
        asked.append(kwargs.get("executor"))
        return original(*args, **kwargs)

    monkeypatch.setattr(car_core, "contrastive", contrastive)
    pytester.makepyfile(test_support=SUPPORT_SUITE)
    result = pytester.runpytest("--car-attribute", "--car-rollouts", "8", "--car-executor",
                                "async")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert asked == ["async"] and "CAR attribution" in out
    # without --car-explain the section is the answer, the table and one line saying where the
    # method is: the whole explain() block per failing test (the step table twice) was too much
    assert "How this was measured" not in out and out.count("<- locus") == 1
    assert ("how this was measured (test, level, sample sizes, pairing): in the report, or "
            "add --car-explain") in out
    assert (pytester.path / "refunds.ledger").read_text().split() == ["A1001"]


def test_a_later_session_on_the_same_store_keeps_the_earlier_report(
        pytester: pytest.Pytester) -> None:
    """With ``--car-store`` a store outlives its session: the test run again records another
    run, and its report used to take the first one's file name (a hash of the test id), so
    the first session's summary and JUnit link described a different run."""
    pytester.makepyfile(test_support=SUPPORT_SUITE)
    store = pytester.path / "kept.db"
    reports, runs = [], []
    for _ in range(2):
        out = pytester.runpytest("--car-attribute", "--car-rollouts", "16", "--car-store",
                                 str(store)).stdout.str()
        reports.append(Path(re.search(r"report: (\S+\.html)", out)[1]))
        runs.append(re.search(r"run ([0-9a-f]{16}) \(\d+ steps\) recorded by", out)[1])
    assert runs[0] != runs[1] and reports[0] != reports[1]
    for run_id, report in zip(runs, reports, strict=True):
        assert run_id in report.read_text(encoding="utf-8")


def test_a_passing_suite_is_untouched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_support=SUPPORT_SUITE.replace("rng_seed=3", "rng_seed=0"),
                        test_plain="def test_plain():\n    assert 1 + 1 == 2\n")
    with_plugin = pytester.inline_run("--car-attribute")
    with_plugin.assertoutcome(passed=2)
    assert all(not rep.sections for rep in with_plugin.getreports("pytest_runtest_logreport"))
    (run,) = stored_runs(session_store(pytester))  # recorded all the same, with its test's node id
    assert run.meta["test"] == "test_support.py::test_refuses_refund" and not run.failed
    without = pytester.inline_run("-p", "no:car", "-p", "no:cacheprovider", "test_plain.py")
    without.assertoutcome(passed=1)


def test_off_by_default_a_failure_is_only_recorded(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_support=SUPPORT_SUITE)
    rec = pytester.inline_run()
    rec.assertoutcome(failed=1)
    assert section(rec.getreports("pytest_runtest_logreport"), "test_refuses_refund") is None
    (run,) = stored_runs(session_store(pytester))
    assert run.failed and run.meta["test"].endswith("test_refuses_refund")
    assert not (pytester.path / ".pytest_cache" / "d" / "car" / "reports").exists()


CANNOT = SUPPORT_SUITE + '''

def test_no_outcome(car_recorder, app):
    car_recorder.watch(app)
    app.invoke(inputs(), {"configurable": {"thread_id": "t2"}})
    assert False


@pytest.mark.car(outcome=outcome)
def test_no_agent(car_recorder, app):
    app.invoke(inputs(), {"configurable": {"thread_id": "t3"}})
    assert False


def test_no_run(car_recorder):
    assert False


@pytest.mark.car(side_effect_tools=["wire_money"])
def test_refused(car_recorder, app):
    car_recorder.watch(app, outcome=outcome)
    app.invoke(inputs(), {"configurable": {"thread_id": "t4"}})
    assert False


@pytest.mark.car(side_effect_tools=["issue_refund"])
def test_unclassified(car_recorder, app):
    car_recorder.watch(app, outcome=outcome)
    app.invoke(inputs(), {"configurable": {"thread_id": "t5"}})
    assert False


@pytest.fixture
def broken():
    raise RuntimeError("setup broke")


def test_setup_error(car_recorder, broken):
    pass
'''


def test_an_attribution_that_cannot_run_says_why_in_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_cannot=CANNOT.replace("def test_refuses_refund", "def _unused"))
    rec = pytester.inline_run("--car-attribute")
    rec.assertoutcome(failed=6)  # inline_run counts the setup error too; it is checked below
    reports = rec.getreports("pytest_runtest_logreport")
    expected = {
        "test_no_outcome": "not attributed: none of the 1 recorded run(s) has an outcome: pass "
                           "outcome= to car_recorder.watch(...) or to @pytest.mark.car",
        "test_no_agent": "not attributed: no agent to branch run ",
        "test_no_run": "not attributed: the test recorded no agent run",
        "test_refused": "not attributed: InvalidInput: side-effect tool(s) ['wire_money'] are "
                        "not tools of this graph",
        "test_unclassified": "not attributed: UnclassifiedTools: LangGraph app 'LangGraph' can "
                             "call 2 tool(s) that nothing classifies as safe to run on a branch "
                             "or as a side effect: ['lookup_order', 'record_decision']",
    }
    for name, start in expected.items():
        text = section(reports, name)
        assert text is not None and text.startswith(start), (name, text)
        assert "\n" not in text, text
    setup = [r for r in reports if r.nodeid.endswith("test_setup_error")]
    assert setup[0].when == "setup" and setup[0].failed and not setup[0].sections
    assert [r.when for r in setup] == ["setup", "teardown"]  # an error, never a failure


FUNCTION_AGENT_SUITE = '''
import car_core as car
from car_core.testing import synthetic


def test_pivot_{i}(car_recorder):
    scm = synthetic.pivot(n_steps=4, at={at}, p_bad=0.3)
    car_recorder.watch(scm.agent(), outcome=scm.outcome)
    run = scm.failing_run(seed={i})
    assert not run.failed
'''


ATTRIBUTE_IN_THE_TEST = '''
import car_core as car
from car_core.testing import synthetic


def test_attributes_itself(car_recorder):
    scm = synthetic.pivot(n_steps=4, at=2, p_bad=0.3)
    car_recorder.watch(scm.agent(), outcome=scm.outcome)
    scm.failing_run(seed=0)
    found = car_recorder.attribute(rollouts=16)
    car.assert_locus(found.result, step=2, agent="synthetic:pivot", run=found.run)
'''


def test_a_failing_function_agent_test_via_car_record(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_pivot=FUNCTION_AGENT_SUITE.format(i=0, at=2),
                        test_itself=ATTRIBUTE_IN_THE_TEST)
    rec = pytester.inline_run("--car-attribute", "--car-rollouts", "16", "test_pivot.py")
    rec.assertoutcome(failed=1)
    text = section(rec.getreports("pytest_runtest_logreport"), "test_pivot_0")
    assert text is not None and text.startswith("Step 2 (synthetic:pivot chose ")
    runs = stored_runs(session_store(pytester))
    assert runs and all(r.meta["test"] == "test_pivot.py::test_pivot_0" for r in runs)
    assert sum(r.failed for r in runs) == 1  # failing_run recorded until the first failure
    pytester.inline_run("test_itself.py").assertoutcome(passed=1)  # attribute() in a test


SIDE_EFFECT_ON_A_FUNCTION_AGENT = '''
import car_core as car
from car_core.testing import synthetic


def test_pivot_notifies(car_recorder):
    scm = synthetic.pivot(n_steps=4, at=2, p_bad=0.3)

    def environment(history, action, rng):
        with open("sent.log", "a") as f:  # the side effect: one real notification a step
            f.write("sent\\n")
        return scm.environment(history, action, rng)

    agent = car.FunctionAgent(policy=scm.policy, environment=environment,
                              is_final=lambda a: bool(a.get("final")), max_steps=4)
    car_recorder.watch(agent, outcome=scm.outcome, side_effect_tools=["notify"])
    run = next(r for r in (car.record(agent, context=None, outcome=scm.outcome, seed=s)
                           for s in range(100)) if r.failed)
    with open("recorded.txt", "w") as f:
        f.write(str(len(open("sent.log").read().splitlines())))
    assert not run.failed
'''


def test_side_effect_tools_named_for_a_function_agent_are_refused_not_dropped(
        pytester: pytest.Pytester) -> None:
    """A ``car.FunctionAgent`` has no named tools CAR could answer from the record, so
    ``side_effect_tools`` given for it would be dropped and its environment's side effects
    run live on every branch. The attribution is refused in one line naming the tool, and
    nothing ran on a branch: the notifications after the run are the recorded ones."""
    pytester.makepyfile(test_notify=SIDE_EFFECT_ON_A_FUNCTION_AGENT)
    rec = pytester.inline_run("--car-attribute", "--car-rollouts", "8", "test_notify.py")
    rec.assertoutcome(failed=1)
    text = section(rec.getreports("pytest_runtest_logreport"), "test_pivot_notifies")
    assert text is not None and "\n" not in text, text
    assert text.startswith("not attributed: AdapterError: side-effect tool(s) ['notify'] "
                           "cannot be applied to a FunctionAgent"), text
    sent = (pytester.path / "sent.log").read_text().splitlines()
    assert len(sent) == int((pytester.path / "recorded.txt").read_text())


def test_shapley_on_request(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_pivot=FUNCTION_AGENT_SUITE.format(i=0, at=1))
    rec = pytester.inline_run("--car-attribute", "--car-method", "shapley", "--car-budget", "64")
    text = section(rec.getreports("pytest_runtest_logreport"), "test_pivot_0")
    assert text is not None and text.startswith("Step 1 (the agent chose "), text
    assert "carries the largest share of the failure" in text.splitlines()[0]
    assert "of 64" in text  # the budget the option gave


def test_xdist_workers_write_their_own_stores_merged_at_the_end(
        pytester: pytest.Pytester) -> None:
    for i in range(4):
        pytester.makepyfile(**{f"test_pivot{i}": FUNCTION_AGENT_SUITE.format(i=i, at=1)})
    result = pytester.runpytest_subprocess("-n", "2", "--car-attribute")
    result.assert_outcomes(failed=4)
    out = result.stdout.str()
    sections, summary = out.split("CAR attribution summary")
    assert len(re.findall(r"^1\s.*<- locus", sections, re.MULTILINE)) == 4
    assert len(re.findall(r"test_pivot\d.py::test_pivot_\d: Step 1 \(synthetic:pivot chose ",
                          summary)) == 4
    folder = session_store(pytester).parent
    assert sorted(p.name for p in folder.glob("*.db")) == ["runs.db"]  # worker files merged
    runs = stored_runs(session_store(pytester))
    assert {r.meta["test"] for r in runs} == {f"test_pivot{i}.py::test_pivot_{i}"
                                              for i in range(4)}
    assert len(list((folder / "reports").glob("*.html"))) == 4


def test_last_failed_reruns_attribute_again_into_a_fresh_store(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_pivot=FUNCTION_AGENT_SUITE.format(i=0, at=1) + '''

def test_ok(car_recorder):
    scm = synthetic.pivot(n_steps=4, at=1, p_bad=0.3)
    car.record(scm.agent(), outcome=scm.outcome, seed=1)
''')
    pytester.inline_run().assertoutcome(passed=1, failed=1)
    assert {r.meta["test"] for r in stored_runs(session_store(pytester))} == {
        "test_pivot.py::test_pivot_0", "test_pivot.py::test_ok"}
    rec = pytester.inline_run("--lf", "--car-attribute")
    rec.assertoutcome(failed=1)
    assert section(rec.getreports("pytest_runtest_logreport"), "test_pivot_0").startswith(
        "Step 1 (")
    assert {r.meta["test"] for r in stored_runs(session_store(pytester))} == {
        "test_pivot.py::test_pivot_0"}


# the planted ticket model both chat-framework suites share: escalates with p = 0.5
TICKET_MODEL = '''
ESCALATE = assistant(None, [tool_call("call_1", "escalate", {"user": "mallory"})])
CLOSE = assistant(None, [tool_call("call_1", "close_ticket", {})])


def decide(messages, tools, rng):
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k == 0:
        return assistant(None, [tool_call("call_0", "fetch_ticket", {})])
    if k == 1:
        return ESCALATE if rng.random() < 0.5 else CLOSE
    return "escalated" if messages[-1].get("name") == "escalate" else "closed"


def escalated(run):
    return any(c["function"]["name"] == "escalate"
               for s in run.steps for c in (s.action or {}).get("tool_calls") or ())
'''

LLAMAINDEX_SUITE = '''
import asyncio

import pytest
from car_adapters.common.messages import assistant, tool_call
from car_adapters.llamaindex import ScriptedLLM
from llama_index.core.agent.workflow import FunctionAgent

''' + TICKET_MODEL + '''

def fetch_ticket() -> str:
    """Read the ticket."""
    return "Printer broken."


def escalate(user: str) -> str:
    """Grant a user admin rights (a side effect)."""
    return user + " is now admin"


def close_ticket() -> str:
    """Close the ticket."""
    return "closed"


@pytest.mark.car(safe_tools=["fetch_ticket", "close_ticket"], side_effect_tools=["escalate"],
                 simulators={"escalate": lambda a: "simulated"})
def test_never_escalates(car_recorder):
    agent = FunctionAgent(tools=[fetch_ticket, escalate, close_ticket],
                          llm=ScriptedLLM(decide, seed=2), system_prompt="Helpdesk.")
    car_recorder.watch(agent, outcome=escalated)
    async def main():
        return await agent.run(user_msg="ticket 7")
    asyncio.run(main())
    assert not escalated(car_recorder.finish()[-1])
'''


def test_a_llamaindex_run_is_recorded_and_attributed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_helpdesk=LLAMAINDEX_SUITE)
    rec = pytester.inline_run("--car-attribute", "--car-rollouts", "16")
    reports = rec.getreports("pytest_runtest_logreport")
    (run,) = stored_runs(session_store(pytester))
    assert run.meta["test"] == "test_helpdesk.py::test_never_escalates"
    assert run.meta["framework"] == "llama-index"
    assert run.failed  # seed 2: the model's first draw (0.26 < 0.5) escalates
    rec.assertoutcome(failed=1)
    text = section(reports, "test_never_escalates")
    assert text is not None and text.startswith("Step 1 (Agent "), text
    assert " decision) caused the failure" in text.splitlines()[0]


OPENAI_AGENTS_SUITE = '''
from pathlib import Path

import pytest
from agents import (Agent, GuardrailFunctionOutput, Runner, function_tool, input_guardrail,
                    set_tracing_disabled)
from car_adapters.common.messages import assistant, tool_call
from car_adapters.openai_agents import ScriptedModel

set_tracing_disabled(True)  # no trace export (it would need an API key)
LEDGER = Path("escalations.ledger")
''' + TICKET_MODEL + '''

@function_tool
def fetch_ticket() -> str:
    """Read the ticket."""
    return "Printer broken."


@function_tool
def escalate(user: str) -> str:
    """Grant a user admin rights (a side effect: the ledger counts each real call)."""
    with LEDGER.open("a") as f:
        f.write(user + "\\n")
    return user + " is now admin"


@function_tool
def close_ticket() -> str:
    """Close the ticket."""
    return "closed"


@pytest.mark.car(safe_tools=["fetch_ticket", "close_ticket"], side_effect_tools=["escalate"],
                 simulators={"escalate": lambda a: "simulated"})
def test_never_escalates(car_recorder):
    agent = Agent(name="Helpdesk", instructions="You are a helpdesk agent.",
                  model=ScriptedModel(decide, seed=2), tools=[fetch_ticket, escalate, close_ticket])
    car_recorder.watch(agent, outcome=escalated)
    Runner.run_sync(agent, "Please handle ticket 7.", hooks=car_recorder.hooks_for(agent))
    assert not escalated(car_recorder.finish()[-1])


@input_guardrail
async def polite(ctx, agent, text):
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered="insult" in str(text))


@pytest.mark.car(safe_tools=["fetch_ticket", "close_ticket"], side_effect_tools=["escalate"],
                 simulators={"escalate": lambda a: "simulated"})
def test_never_escalates_behind_a_guardrail(car_recorder):
    agent = Agent(name="Helpdesk", instructions="You are a helpdesk agent.",
                  model=ScriptedModel(decide, seed=2), tools=[fetch_ticket, escalate, close_ticket],
                  input_guardrails=[polite])
    car_recorder.watch(agent, outcome=escalated)
    with car_recorder.recording(agent):  # an app with guardrails is recorded in the block
        Runner.run_sync(agent, "Please handle ticket 7.", hooks=car_recorder.hooks_for(agent))
    assert not escalated(car_recorder.finish()[-1])
'''


def test_a_failing_openai_agents_test_gets_its_locus_and_no_branch_escalates(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_helpdesk=OPENAI_AGENTS_SUITE)
    result = pytester.runpytest("--car-attribute", "--car-rollouts", "32")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    # the locus row of each test's step table: step, what it did, rescue, interval
    found = re.findall(r"^(\d)\s.*?[+-]\d\.\d{3}\s+\[([+-]\d\.\d{3}), ([+-]\d\.\d{3})\]"
                       r".*<- locus", out, re.MULTILINE)
    assert len(found) == 2, out
    # step 1 escalates with probability 0.5 and nothing else is random: P(fail | held) = 1,
    # P(fail | step 1 resampled) = 0.5, so the analytic rescue 0.5 lies in its interval (at
    # the Bonferroni level over the 3 steps this misses about once in a hundred runs); the
    # app with a guardrail, recorded in the fixture's block, gets the same answer
    for step, lo, hi in found:
        assert int(step) == 1 and float(lo) <= 0.5 <= float(hi)
    assert out.count("Step 1 (Helpdesk called escalate(user=\"mallory\")") >= 2
    runs = stored_runs(session_store(pytester))
    assert all(r.meta["framework"] == "openai-agents" and r.failed for r in runs)  # seed 2
    assert sorted(r.meta["test"] for r in runs) == [
        "test_helpdesk.py::test_never_escalates",
        "test_helpdesk.py::test_never_escalates_behind_a_guardrail"]
    assert [r.meta.get("guardrails_watched") for r in runs if "guardrail" in r.meta["test"]
            ] == [["input guardrail 'polite'"]]
    # each recorded run escalated once; no branch ran the real tool (record or simulator)
    assert (pytester.path / "escalations.ledger").read_text().split() == ["mallory"] * 2


def test_hooks_for_refuses_an_agent_recorded_without_hooks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_hooks='''
import pytest
from car_core.errors import AdapterError

def test_hooks(car_recorder):
    with pytest.raises(AdapterError, match="no run hooks for a object"):
        car_recorder.hooks_for(object())
''')
    pytester.inline_run().assertoutcome(passed=1)


def test_the_plugin_loads_without_any_framework_or_car_core() -> None:
    probe = ("import sys; import car_adapters.pytest_plugin; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'car_core', 'langgraph', "
             "'langchain_core', 'llama_index', 'numpy', 'agents'}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_an_undecided_attribution_says_so_and_its_command_decides_it(
        pytester: pytest.Pytester) -> None:
    """16 rollouts are too few for the planted step 2 to be confirmed: the headline says
    "undecided", names the step the search was testing and the command that attributes the
    test again with more (saying it resumes nothing); run, its doubled budget decides it."""
    pytester.makepyfile(test_pivot=FUNCTION_AGENT_SUITE.format(i=0, at=2))
    rec = pytester.inline_run("--car-attribute", "--car-rollouts", "16", "--car-budget", "16")
    text = section(rec.getreports("pytest_runtest_logreport"), "test_pivot_0")
    assert text is not None and text.startswith("Undecided: the budget ran out"), text
    # the step it was testing, and who decided it, in the headline (explain() and its
    # "the candidate is step 2" are behind --car-explain)
    assert "testing step 2 (synthetic:pivot chose " in text.splitlines()[0], text
    command = ("pytest test_pivot.py::test_pivot_0 --car-attribute --car-rollouts 16 "
               "--car-budget 32 --car-wall-time 60")
    assert ("to attribute with a larger budget, run the test again (a new run is recorded; "
            f"nothing is resumed): {command}") in text
    again = pytester.inline_run(*command.split()[1:])
    text = section(again.getreports("pytest_runtest_logreport"), "test_pivot_0")
    assert text is not None and text.startswith("Step 2 (synthetic:pivot chose ")


def test_a_parametrized_tests_report_is_named_by_its_file_and_function_first() -> None:
    """A user trial's reports read "_budget_I_need_to_get_to_Oslo…html": the last 80
    characters of a long id were all parameter, and the test's file and function were lost.
    The name keeps the id without its parameters (its last 80 characters), then the
    parameters' first few."""
    from car_adapters.pytest_plugin import _report_path
    long = ("tests/test_travel.py::test_booking_stays_within_budget[I need to get to Oslo on "
            "Monday. Send the confirmation to bo@example.com]")
    name = _report_path(Path("s/runs.db"), long).name
    assert name.startswith("tests_test_travel.py_test_booking_stays_within_budget_I_need_to"), name
    assert _report_path(Path("s/runs.db"), long) != _report_path(Path("s/runs.db"), long + "x")
    plain = "examples/pytest_suite/test_support_agent.py::test_injection_does_not_get_a_refund"
    assert _report_path(Path("s/runs.db"), plain).name.startswith(
        "examples_pytest_suite_test_support_agent.py_test_injection_does_not_get_a_refund-")
