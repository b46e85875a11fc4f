"""The LlamaIndex ticket-agent example does what its docstring says, on its default fake model."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.instrumentation import get_dispatcher

import car_core as car

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llamaindex_ticket_agent.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("llamaindex_ticket_agent", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_example_names_the_decision_and_removing_the_attachment_rescues(tmp_path: Any) -> None:
    ex = load_example()
    handlers = len(get_dispatcher().span_handlers)
    out = ex.main(["--rollouts", "32", "--store", str(tmp_path / "runs.db")])
    assert len(get_dispatcher().span_handlers) == handlers     # the recorder was detached
    run = out["run"]
    assert ex.outcome(run) and len(run.steps) == 5
    assert out["locus"] == 1                                    # the decision, not the grant
    # Analytic arms: resampling step 1 fails with P_FOLLOW = 0.5, and with the attachment text
    # gone with P_UNPROMPTED = 0.05. With n = 32 the standard errors are sqrt(0.25/32) = 0.088
    # and sqrt(0.0475/32) = 0.039; the tolerance is 4 of them.
    n = 32
    assert abs(out["factual"] - ex.P_FOLLOW) <= 4 * math.sqrt(0.25 / n)
    assert abs(out["rescued"] - ex.P_UNPROMPTED) <= 4 * math.sqrt(0.05 * 0.95 / n)
    stored = car.RunStore(tmp_path / "runs.db").load(run.id)
    assert stored.to_dict() == run.to_dict()


def test_edit_removes_only_the_attachment() -> None:
    ex = load_example()
    msgs = [{"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "c", "name": "read_ticket", "content": ex.TICKET}]
    edited = ex.remove_attachment(msgs)
    assert edited[0] == msgs[0]
    assert ex.INJECTION not in edited[1]["content"]
    assert edited[1]["content"] == ex.TICKET.split("\nAttachment")[0]
