"""How results are said to people: one vocabulary and one number format for every surface.

The plain-text ``str()`` of a result, the ``car`` command's tables and verdicts, the pytest
plugin's headline and summary, the demo's printout and the HTML report all build their words
here, so the same attribution reads the same way wherever it is shown:

- probabilities with three decimals (``prob``), effects (rescue, φ) signed (``effect``) and
  their intervals likewise (``effect_interval``); a missing (None) or non-finite value is
  written as ``missing``;
- confidence levels as percentages (``level``: ``"95%"``, never ``0.9500``);
- the same column names (``STEP_COLUMNS``, ``SHAPLEY_COLUMNS``) and the same locus mark;
- the method named as it was computed (``method``);
- the rescue shown beside the failure rates of the very sample it and its interval were
  computed from (``step_row``), with one line saying so when the test decided on other pairs
  (``sample_note``).

Numbers live in ``numbers``, what a step did in ``actions``, what it did instead when
re-drawn in ``alternatives``, how a run ended in ``endings``, where a branch step and its
tool results came from in ``provenance``, the tables in ``rows`` and the sentences in
``sentences``; every name is read from here (``from car_core import formatting as fmt``).
"""

from __future__ import annotations

from car_core.formatting.actions import (
    ACTION_CHARS,
    action_summary,
    step_actions,
)
from car_core.formatting.alternatives import (
    ALTERNATIVE_COLUMNS,
    RECORDED,
    TOO_FEW,
    alternative_cells,
    alternatives_heading,
)
from car_core.formatting.endings import STOPPED, ending_line, status_word
from car_core.formatting.numbers import (
    MISSING,
    PROB_DIGITS,
    effect,
    effect_interval,
    failure_rate,
    interval,
    level,
    num,
    pct,
    percent,
    percent_interval,
    prob,
    prob_interval,
    steps_span,
)
from car_core.formatting.provenance import (
    ORIGIN_MEANINGS,
    SOURCE_WORDS,
    origin_label,
    origins_legend,
    tool_marks,
    tool_marks_text,
)
from car_core.formatting.rows import (
    ACTION,
    HELD,
    INTERVAL,
    LOCUS_MARK,
    NOT_SIGNIFICANT,
    NOT_TESTED,
    PAIRS,
    PHI,
    PLAIN_COLUMNS,
    PLAIN_SHAPLEY_COLUMNS,
    PLAYER,
    REDRAWN,
    RESCUE,
    SHAPLEY_COLUMNS,
    SIGNIFICANT,
    STEP,
    STEP_COLUMNS,
    TESTED,
    StepRow,
    coupling_note,
    method,
    plain_cells,
    sample_note,
    shown_sample,
    step_row,
    untested_mark,
)
from car_core.formatting.sentences import (
    answer,
    coupling,
    decided_by,
    headline,
    later_steps,
    locus_name,
    shapley_leaders,
    step_said,
)

__all__ = [
    "ACTION", "ACTION_CHARS", "ALTERNATIVE_COLUMNS", "RECORDED", "TOO_FEW", "alternative_cells",
    "alternatives_heading", "HELD", "INTERVAL", "LOCUS_MARK", "MISSING", "NOT_SIGNIFICANT",
    "NOT_TESTED", "ORIGIN_MEANINGS", "PAIRS", "PHI", "PLAIN_COLUMNS", "PLAIN_SHAPLEY_COLUMNS",
    "PLAYER", "PROB_DIGITS", "REDRAWN", "RESCUE", "SHAPLEY_COLUMNS", "SIGNIFICANT", "SOURCE_WORDS",
    "STEP", "STEP_COLUMNS", "STOPPED", "StepRow", "TESTED", "action_summary", "answer",
    "coupling", "coupling_note", "decided_by", "effect", "effect_interval", "ending_line",
    "failure_rate", "headline", "interval", "later_steps", "level", "locus_name", "method", "num",
    "origin_label", "origins_legend", "pct", "percent", "percent_interval", "plain_cells", "prob",
    "prob_interval", "sample_note", "shapley_leaders", "shown_sample", "status_word",
    "step_actions", "step_row", "step_said", "steps_span", "tool_marks", "tool_marks_text",
    "untested_mark",
]
