"""Estimators that turn interventions into blame: contrastive (point of commitment) and
Shapley (credit split across steps that only fail together)."""

from .contrastive import contrastive
from .shapley import shapley

__all__ = ["contrastive", "shapley"]
