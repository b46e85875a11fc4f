"""Sizes an estimate may be asked for, checked before any branch runs: upper bounds a slip
(``rollouts=2**63``) cannot pass unnoticed but a user can raise knowingly (``max_rollouts=``,
``max_budget=``; ``defaults.MAX_ROLLOUTS`` / ``MAX_BUDGET`` say why these values), and the
rule that resuming a finished attribution never silently shrinks its stored result."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from car_core.errors import AttributionNotFound, InvalidInput
from car_core.model.budget import check_bound
from car_core.model.checks import is_whole

if TYPE_CHECKING:  # the store brings sqlite-utils: loaded only where one is used
    from car_core.store import RunStore

# The most rollouts one arm and the whole attribution may run, read from its params (the
# ones it is started with, or the ones a stored attribution was): how a resume compares them.
Planned = Callable[[Mapping[str, Any]], tuple[int, int]]


def check_max(value: Any, name: str) -> None:
    """A bound itself must be a count: ``max_rollouts=0`` would refuse everything."""
    if not is_whole(value, 1):
        raise InvalidInput(f"{name}={value!r} must be a whole number >= 1",
                           hint=f"leave {name} at its default, or raise it knowingly")


def contrastive_planned(n_steps: int, cap: int) -> tuple[int, int]:
    """Contrastive spends its rollout cap (``n·K`` unless a budget gives another) over arms of
    at most ``cap // n`` rollouts each."""
    return max(1, cap // n_steps), cap


def check_contrastive_size(n_steps: int, rollouts: int, cap: int, *, budgeted: bool,
                           max_rollouts: int, max_budget: int) -> None:
    """Refuse a contrastive estimate that may run past its bounds: ``K`` past
    ``max_rollouts``, ``n·K`` past ``max_budget``; with a rollout budget, which replaces
    ``n·K`` as the cap (``rollout_budget``), that budget past ``max_budget``. A huge ``K``
    under a budget that caps it is no slip: the budget is what runs."""
    check_max(max_rollouts, "max_rollouts")
    check_max(max_budget, "max_budget")
    if budgeted:
        check_bound(cap, max_budget, "budget", "max_budget=")
        return
    check_bound(rollouts, max_rollouts, "rollouts", "max_rollouts=")
    check_bound(cap, max_budget, f"rollouts={rollouts} over {n_steps} steps", "max_budget=")


def check_not_shrunk(store: RunStore, attribution_id: str, method: str,
                     params: Mapping[str, Any], planned: Planned) -> None:
    """A resume of an attribution that has a result, with settings that allow fewer rollouts
    (in an arm or in all) than it was run with, would replace that result with one from fewer
    rollouts: refused, the stored result kept, unless the caller passes ``replace=True``."""
    try:
        earlier = store.attribution(attribution_id)
    except AttributionNotFound:
        return
    if earlier.result is None or earlier.method != method:
        return  # nothing to lose, or another method (``check_resumable`` refuses that)
    try:
        then = planned(earlier.params)
    except (KeyError, TypeError, ValueError):  # an older row without its sizes
        return
    now = planned(params)
    if now[0] >= then[0] and now[1] >= then[1]:
        return
    raise InvalidInput(f"attribution {attribution_id} already has a {earlier.status} result "
                       f"from {earlier.result.rollouts_used} rollouts; these settings allow at "
                       f"most {now[1]} (it allowed {then[1]}) and would replace it",
                       hint="resume with its own settings or larger, or pass replace=True to "
                            "replace its result knowingly")
