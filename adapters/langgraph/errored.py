"""A run that ended with an error, refused before any branch.

Every contrastive search compares re-deciding from step 0 with holding the whole record, and
the arm that holds every recorded step goes on from where the run stopped. A LangGraph run
that raised (a model server's 503 after the refund, a chat UI's Stop) stopped inside a call
that never finished: the record keeps no checkpoint to re-run it from, and the held copy of an
errored run is an errored branch. A user trial's run ran eight branches and stopped with
"the replay itself breaks... fix the agent". Copying the recorded outcome into that arm
instead would be worse: where the failure is the error itself, every earlier arm would look
like a rescue and the last step would be blamed for a server's outage. So such a run is
refused by name, before any branch.
"""

from __future__ import annotations

from car_core.contract import RunStatus, Trajectory
from car_core.errors import AdapterError


def refuse_errored(run: Trajectory) -> None:
    """Refuse ``run`` when it ended with an error (module docstring)."""
    if run.status != RunStatus.ERROR:
        return
    said = f" ({run.error})" if run.error else ""
    raise AdapterError(
        f"the run ended with an error after step {len(run.steps) - 1}{said}, inside a call "
        "that never finished: LangGraph keeps no checkpoint to go on from there, so the arm "
        "that holds every recorded step cannot run, and no branch runs",
        run_id=run.id,
        hint="record the run again once what raised is fixed or retried (a model with "
             "max_retries, a node with retry_policy=RetryPolicy()), so that it finishes")
