"""Whether a safe tool's live error on a branch is the call's own (scored) or its world's (not
scored), decided by ``car_adapters.common.sources.drifted_tools`` from the record and from the
tool run again (a fake ``Reruns`` here, which notes each call it is asked to make)."""

from __future__ import annotations

import asyncio
import json

import pytest
from car_adapters.common.messages import assistant, canonical_arguments, tool_call
from car_adapters.common.sources import TOOL_SOURCES, Reruns, drifted_tools

from car_core.contract import Step, ToolSource, says_service_down
from car_core.errors import AdapterError

RECORDED = {"order_id": "A1"}
REWORDED = {"order_id": "A1", "reason": "item cracked on arrival"}


def lookup(index: int, cid: str, args: dict[str, str]) -> Step:
    return Step(index=index, action=assistant(None, [tool_call(cid, "lookup_order", args)]),
                meta={TOOL_SOURCES: {cid: ToolSource.LIVE}})


class Tool:
    """A fake re-run: ``errors`` maps canonical arguments to the error the tool gives them now
    (absent: it answers); ``calls`` notes every re-run made."""

    def __init__(self, errors: dict[str, str], safe: tuple[str, ...] = ("lookup_order",),
                 classified: tuple[str, ...] = ()):
        self.errors, self.calls = errors, list[tuple[str, str]]()
        self.reruns = Reruns(safe, self.rerun, classified)

    async def rerun(self, name: str, args: str) -> str | None:
        self.calls.append((name, args))
        return self.errors.get(args)


def decide(tool: Tool, branch_args: dict[str, str], said: str = "no such order",
           recorded_errors: tuple[str, ...] = (), outages: tuple[str, ...] = (),
           record: bool = True) -> str | None:
    recorded = [lookup(0, "rec", RECORDED)] if record else []
    drift = asyncio.run(drifted_tools(recorded, recorded_errors, [lookup(0, "new", branch_args)],
                                      {"new": said}, tool.reruns, outages))
    assert drift is None or drift.step == 0  # the step the tool ran at, for the error's tag
    return None if drift is None else drift.text


NEW, OLD = canonical_arguments(REWORDED), canonical_arguments(RECORDED)


@pytest.mark.parametrize(("now", "scored", "why", "reruns"), [
    # the same call answers when run again: a transient failure, the service's
    ({}, False, "answered the same call when CAR ran it again", [NEW]),
    # the same call errors again and so does the record's answered call: the world changed
    ({NEW: "no such order", OLD: "no credentials"}, False,
     "the record's answered call of it (arguments {\"order_id\":\"A1\"}) errors too", [NEW, OLD]),
    # the same call errors again and the record's call still answers: the call's own error
    ({NEW: "no such order"}, True, None, [NEW, OLD]),
])
def test_an_error_is_the_calls_own_only_when_it_repeats_and_the_record_still_answers(
        now: dict[str, str], scored: bool, why: str | None, reruns: list[str]) -> None:
    tool = Tool(now)
    said = decide(tool, REWORDED)
    assert (said is None) is scored
    if why is not None:
        assert said is not None and why in said and "is not scored" in said
        # the estimate's hint is then "bring that service up ...", not "fix the agent"
        assert says_service_down(said)
    assert tool.calls == [("lookup_order", a) for a in reruns]


def test_with_no_answered_call_of_the_tool_in_the_record_a_repeated_error_is_scored() -> None:
    tool = Tool({NEW: "no such order"})
    assert decide(tool, REWORDED, record=False) is None
    # an error about what the call asked for stays the call's, whatever words it uses
    for said in ("Access denied: order 99 belongs to another customer",
                 "refunds above 100 are forbidden by policy"):
        tool = Tool({NEW: said})
        assert decide(tool, REWORDED, said, record=False) is None, said
    assert tool.calls == [("lookup_order", NEW)]
    # the record's one call of the tool errored too: no answered call to run again
    tool = Tool({NEW: "no such order"})
    assert decide(tool, REWORDED, recorded_errors=("rec",)) is None
    assert tool.calls == [("lookup_order", NEW)]


@pytest.mark.parametrize(("args", "said", "outages", "why"), [
    (RECORDED, "no such order", (), "where the record's identical call was answered"),
    (REWORDED, "Error: orders service unavailable (503)", (), "says its service is down"),
    # the SDK's message hid the error, whose exception showed the session was gone
    (REWORDED, "Error invoking MCP tool lookup_order on server 'orders': ", ("new",),
     "says its service is down"),
    # the tool's own world where the estimate runs, not the call (a trial's lookup, never
    # called in the record, said this on every branch and each was scored)
    (REWORDED, "sqlite3.OperationalError: database is locked", (), "says its service is down"),
    (REWORDED, "Error code: 401 Unauthorized: invalid API key", (), "says its service is down"),
    (REWORDED, "[Errno -2] Name or service not known", (), "says its service is down"),
])
def test_the_records_answer_and_an_outage_need_no_rerun(args: dict[str, str], said: str,
                                                        outages: tuple[str, ...],
                                                        why: str) -> None:
    tool = Tool({})
    out = decide(tool, args, said, outages=outages)
    assert out is not None and why in out
    assert tool.calls == []


def test_a_tool_not_classified_safe_is_never_run_again_and_its_error_not_scored() -> None:
    # it ran live only because unclassified="live" let it: not called a safe tool
    tool = Tool({}, safe=())
    out = decide(tool, REWORDED)
    assert out is not None and out.startswith("tool 'lookup_order' ran live at step 0")
    assert "safe tool" not in out and 'unclassified="live"' in out
    assert tool.calls == []
    with pytest.raises(AdapterError, match="not classified safe"):
        asyncio.run(tool.reruns("lookup_order", NEW))


def test_a_safe_tool_car_cannot_run_again_has_its_error_not_scored() -> None:
    # classified safe, but it needs what the framework hands it (a workflow Context)
    tool = Tool({}, safe=(), classified=("lookup_order",))
    out = decide(tool, REWORDED)
    assert out is not None and out.startswith("safe tool 'lookup_order' ran live at step 0")
    assert "cannot run it again" in out
    assert tool.calls == []


def test_each_call_is_run_again_once_per_branch() -> None:
    tool = Tool({NEW: "no such order"})
    steps = [lookup(0, "a", REWORDED), lookup(1, "b", REWORDED)]
    out = asyncio.run(drifted_tools([lookup(0, "rec", RECORDED)], (), steps,
                                    {"a": "no such order", "b": "no such order"}, tool.reruns))
    assert out is None
    assert tool.calls == [("lookup_order", NEW), ("lookup_order", OLD)]
    assert json.loads(NEW) == REWORDED


def test_one_answered_call_of_the_record_that_still_answers_keeps_the_world_as_it_was() -> None:
    # the record's first "answered" call was an error worded as an answer (an SDK tool's own
    # failure function): it errors again, but the second still answers, so the branch's error
    # is the call's own; a trial's orchestrator read "the tool's world changed" and left out
    # three branches of an app that works
    other = {"order_id": "B2"}
    recorded = [lookup(0, "r1", RECORDED), lookup(1, "r2", other)]
    tool = Tool({NEW: "no such order", OLD: "no such order"})
    out = asyncio.run(drifted_tools(recorded, (), [lookup(0, "new", REWORDED)],
                                    {"new": "no such order"}, tool.reruns))
    assert out is None
    assert tool.calls == [("lookup_order", a) for a in (NEW, OLD, canonical_arguments(other))]
    # when every one errors now, the world changed, and the reason counts them
    tool = Tool({NEW: "down", OLD: "down", canonical_arguments(other): "down"})
    out = asyncio.run(drifted_tools(recorded, (), [lookup(0, "new", REWORDED)],
                                    {"new": "down"}, tool.reruns))
    assert out is not None and "the record's 2 answered calls of it" in out.text
