"""The rows a result is made of — a step's rescue, an arm, an alternative action, a player's
Shapley value, a coalition's value — each serialised from its fields (``model.json_fields``),
with the interval codec they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from car_core.model.json_fields import Codec, Row, dump_fields, load_fields, nested, value
from car_core.stats import Interval


def _dump_ci(obj: Any, name: str) -> dict[str, Any]:
    ci: Interval | None = getattr(obj, name)
    return ({"ci": None, "ci_level": None} if ci is None else
            {"ci": [float(ci[0]), float(ci[1])], "ci_level": ci.level})


def _load_ci(row: Row, name: str, level: float | None) -> Interval | None:
    """The interval stored under ``ci``; results written before intervals carried their level
    (no ``ci_level``) get the result's ``level``, the level they were labelled with then."""
    bounds = row.get("ci")
    built = row.get("ci_level", level)
    return None if bounds is None else Interval.of(bounds, float(built if built is not None
                                                                 else 0.95))


CI = Codec(_dump_ci, _load_ci)  # an interval: its bounds and, beside them, its level
@dataclass(frozen=True)
class Alternative:
    """One action the agent took when a step was re-drawn (steps before it held), read from
    the branches the estimate ran: its ``share`` of them and the failure rate ``p_fail`` of
    the branches that took it, each with a Wilson interval at the result's level. ``n`` is
    how many branches took it; below a few (``estimators.alternatives.MIN_BRANCHES``) its
    failure rate is too few to tell (``p_fail`` None). ``action`` is the group's key: the
    tool calls (name and canonical arguments) or the reply's text, or what the user's
    ``action_key`` returned."""

    action: str
    share: float
    share_ci: Interval
    p_fail: float | None
    p_fail_ci: Interval | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, _ALTERNATIVE)

    @classmethod
    def from_dict(cls, data: Row, level: float | None = None) -> Alternative:
        return load_fields(cls, data, _ALTERNATIVE, level)  # type: ignore[no-any-return]


def _bounds(name: str) -> Codec:
    """An interval written as ``[low, high]`` under ``name``; its level is the result's."""
    def dump(obj: Any, _: str) -> dict[str, Any]:
        ci: Interval | None = getattr(obj, name)
        return {name: None if ci is None else [float(ci[0]), float(ci[1])]}

    def load(row: Row, _: str, level: float | None) -> Interval | None:
        return Interval.of(row.get(name), float(level if level is not None else 0.95))
    return Codec(dump, load)


_ALTERNATIVE = {"share_ci": _bounds("share_ci"), "p_fail_ci": _bounds("p_fail_ci")}


@dataclass(frozen=True)
class StepEffect:
    """Rescue of one step: P(fail | step held) − P(fail | step resampled), both estimated."""

    step: int
    effect: float | None = None
    ci: Interval | None = None
    tested: bool = False
    significant: bool = False
    fail_held: float | None = None
    fail_resampled: float | None = None
    n: int = 0
    effect_raw: float | None = None  # the mean of the pairs the test stopped on
    # "refit": ``effect`` re-estimated after the test stopped, on fresh pairs and the test's
    # own but the one it stopped on (``refit_pooled`` of the ``refit_n``)
    estimate: str = "raw"
    refit_n: int = 0
    # P(fail) held and re-drawn over the re-estimate's ``refit_n`` pairs: the sample
    # ``effect`` and ``ci`` are about (``fail_held``/``fail_resampled`` are the test's pairs)
    refit_held: float | None = None
    refit_resampled: float | None = None
    refit_pooled: int = 0  # of the ``refit_n``, the test's own pairs pooled with the fresh
    # a step after the locus shown to rescue less than the result's ``indifference``
    ruled_out: bool = False
    # what the agent did when this step was re-drawn, most taken first, and the key of what
    # it did in the recorded run (the row marked "recorded" where it was re-drawn too)
    alternatives: tuple[Alternative, ...] = ()
    recorded_action: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, _STEP_EFFECT)

    @classmethod
    def from_dict(cls, data: Row, level: float | None = None) -> StepEffect:
        return load_fields(cls, data, _STEP_EFFECT, level)  # type: ignore[no-any-return]


_STEP_EFFECT = {"ci": CI,  # the raw mean is written out even where it is the effect itself
                "alternatives": nested(Alternative.from_dict, many=True, missing=()),
                "effect_raw": Codec(lambda s, _: {"effect_raw": s.effect if s.effect_raw is None
                                                  else s.effect_raw},
                                    value(missing=None).load)}


@dataclass(frozen=True)
class ArmEstimate:
    """Arm ``H_j``: P(fail | steps < j held as recorded, steps >= j live)."""

    hold_before: int
    mean: float
    ci: Interval
    n: int

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, _WITH_CI)

    @classmethod
    def from_dict(cls, data: Row, level: float | None = None) -> ArmEstimate:
        arm: ArmEstimate = load_fields(cls, data, _WITH_CI, level)
        assert arm.ci is not None, "an arm estimate always has an interval"
        return arm


_WITH_CI = {"ci": CI}


@dataclass(frozen=True)
class ShapleyValue:
    """One player's Shapley value: a step, or the other steps grouped (``step`` None)."""

    step: int | None
    label: str
    estimate: float | None
    ci: Interval | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, _SAMPLE)

    @classmethod
    def from_dict(cls, data: Row, level: float | None = None) -> ShapleyValue:
        return load_fields(cls, data, _SAMPLE, level)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class GameValue:
    """``v(S)`` for the full or the empty coalition, with its Wilson interval."""

    mean: float | None
    ci: Interval | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return dump_fields(self, _SAMPLE)

    @classmethod
    def from_dict(cls, data: Row, level: float | None = None) -> GameValue:
        return load_fields(cls, data, _SAMPLE, level)  # type: ignore[no-any-return]


# an estimate's interval, and its sample size (rows stored before sizes were kept: none)
_SAMPLE = {"ci": CI, "n": value(from_json=int, missing=0)}
