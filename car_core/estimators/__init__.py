"""Estimators that turn interventions into blame: contrastive (point of commitment) and
Shapley (credit split across steps that only fail together)."""

from car_core.estimators.contrastive import contrastive
from car_core.estimators.shapley import shapley

__all__ = ["contrastive", "shapley"]
