"""The report's plots as geometry: pixel positions, tick marks and label layout computed from
the numbers, so the template only draws (``report.html.j2``) and the tests can check the
drawing against the data. No agent text is placed here unescaped: labels and titles are
plain strings the template escapes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from car_core import formatting as fmt

PLOT_W, PLOT_H = 720, 200
MARGIN = {"left": 56, "right": 16, "top": 16, "bottom": 40}
UNTESTED_FILL = "#eceff3"  # the shaded column of an untested step, and its legend swatch


class _Axis:
    """Linear map from data values to pixels, with round tick marks."""

    def __init__(self, lo: float, hi: float, p0: float, p1: float) -> None:
        if hi - lo < 1e-9:
            lo, hi = lo - 0.5, hi + 0.5
        self.lo, self.hi, self.p0, self.p1 = lo, hi, p0, p1

    def __call__(self, v: float) -> float:
        v = min(max(v, self.lo), self.hi)
        return round(self.p0 + (v - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0), 2)

    def ticks(self) -> list[dict[str, Any]]:
        span = self.hi - self.lo
        step = next(s for s in (0.05, 0.1, 0.2, 0.25, 0.5, 1.0) if span / s <= 8)
        first = math.ceil(self.lo / step - 1e-9)
        out = []
        v = first * step
        while v <= self.hi + 1e-9:
            out.append({"pos": self(v), "label": f"{v:.2f}".rstrip("0").rstrip(".")
                        if abs(v) > 1e-12 else "0"})
            v += step
        return out


def _range(values: Iterable[float | None], include: Sequence[float] = (0.0,),
           pad: float = 0.05) -> tuple[float, float]:
    vals = [v for v in values if v is not None] + list(include)
    lo, hi = min(vals), max(vals)
    return max(-1.0, lo - pad), min(1.0, hi + pad)


def _unmeasured(s: Mapping[str, Any], r: Mapping[str, Any] | None) -> str:
    """What the step-by-step table says of a step with no rescue measured, for its column's
    title: ruled out (at the indifference level), or why it was not tested."""
    k = int(s["step"])
    if s.get("ruled_out"):
        delta = r.get("indifference") if r is not None else None
        return (f"step {k}: ruled out" + (f", re-deciding it moves P(fail) by less than "
                                          f"{fmt.percent(delta)}" if delta is not None else ""))
    why = fmt.untested_mark(r, k) if r is not None else "not tested"
    return f"step {k}: {why} (no rescue measured)"


def rescue_plot(steps: Sequence[Mapping[str, Any]], locus: int | None,
                r: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Per-step rescue with its interval; an untested step is a shaded column with no mark
    on the value axis, so it cannot be read as a rescue of zero, titled as the table words it
    (``r``: the result, for those words)."""
    if not steps:
        return {}
    lows = [s["ci"][0] for s in steps if s.get("ci")]
    highs = [s["ci"][1] for s in steps if s.get("ci")]
    y = _Axis(*_range(lows + highs), PLOT_H - MARGIN["bottom"], MARGIN["top"])
    inner = PLOT_W - MARGIN["left"] - MARGIN["right"]
    slot = inner / len(steps)
    points = []
    for i, s in enumerate(steps):
        cx = round(MARGIN["left"] + slot * (i + 0.5), 2)
        tested = bool(s.get("tested")) and s.get("effect") is not None
        point: dict[str, Any] = {"x": cx, "step": s["step"], "tested": tested,
                                 "locus": s["step"] == locus,
                                 "significant": bool(s.get("significant")),
                                 "label_every": len(steps) <= 30 or i % 5 == 0
                                 or s["step"] == locus}
        if tested:
            lo, hi = s["ci"] if s.get("ci") else (s["effect"], s["effect"])
            point.update(y=y(s["effect"]), y_lo=y(lo), y_hi=y(hi),
                         title=f"step {s['step']}: rescue {fmt.num(s['effect'])} "
                               f"{fmt.interval(s.get('ci'))}, n={fmt.shown_sample(s)[2]}")
        else:
            # No measurement, so no mark on the value axis (a dot at 0 reads as "no effect"):
            # a shaded column over the whole plot height, with a question mark in it.
            point.update(col_x=round(cx - slot * 0.4, 2), col_w=round(slot * 0.8, 2),
                         col_y=MARGIN["top"], col_h=PLOT_H - MARGIN["top"] - MARGIN["bottom"],
                         mark_y=round(MARGIN["top"] + 14, 2),
                         title=_unmeasured(s, r))
        points.append(point)
    return {"w": PLOT_W, "h": PLOT_H, "m": MARGIN, "zero": y(0.0), "ticks": y.ticks(),
            "points": points, "cap": min(8.0, slot / 4), "untested": UNTESTED_FILL,
            "any_untested": any(not p["tested"] for p in points)}


def arms_plot(arms: Sequence[Mapping[str, Any]], n_steps: int | None) -> dict[str, Any]:
    """P(failure) per arm ``hold < j`` with its interval, as bars."""
    if not arms:
        return {}
    y = _Axis(0.0, 1.0, PLOT_H - MARGIN["bottom"], MARGIN["top"])
    inner = PLOT_W - MARGIN["left"] - MARGIN["right"]
    slot = inner / len(arms)
    bars = []
    for i, a in enumerate(arms):
        j = a["hold_before"]
        x = MARGIN["left"] + slot * i
        lo, hi = a.get("ci") or (a["mean"], a["mean"])
        label = "all held" if n_steps is not None and j >= n_steps else f"<{j}"
        bars.append({"x": round(x + slot * 0.15, 2), "w": round(slot * 0.7, 2),
                     "cx": round(x + slot / 2, 2), "y": y(a["mean"]), "y_lo": y(lo), "y_hi": y(hi),
                     "label": label, "show_label": len(arms) <= 30 or i % 5 == 0,
                     "title": f"hold steps < {j}: P(failure) {fmt.num(a['mean'])} "
                              f"{fmt.interval(a.get('ci'))}, n={a.get('n', '?')}"})
    return {"w": PLOT_W, "h": PLOT_H, "m": MARGIN, "base": y(0.0), "ticks": y.ticks(),
            "bars": bars, "cap": min(8.0, slot / 4)}


FONT_PX = 12  # the plots' text size (the template's ``svg text`` rule)
# Advance widths in em, grouped and rounded up from DejaVu Sans, the widest of the template's
# fonts on a stock Linux (Roboto, Segoe UI, Helvetica and Arial are narrower), so a column
# sized from them holds its text in any of them. A character in no group (other scripts,
# symbols) counts as 1 em, the width of a CJK ideograph.
_EM_WIDTHS = ((0.42, " fijlrtIJ'!,.:;|/\\()[]"),
              (0.64, "abcdeghknopqsuvxyz0123456789$?*_`\"{}-"),
              (0.82, "ABCDEFGHKLNOPQRSTUVXYZ&w"))


def text_width(text: str, px: float = FONT_PX) -> float:
    """An upper bound of ``text``'s rendered width in pixels at ``px``, so a label column laid
    out from it never clips its text."""
    em = 0.0
    for ch in text:
        em += next((w for w, chars in _EM_WIDTHS if ch in chars), 1.0)
    return em * px


def wrap_label(text: str, width: float) -> list[str]:
    """``text`` in lines of at most ``width`` pixels, broken at spaces (a word longer than a
    line is broken where it must be)."""
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        trial = f"{line} {word}" if line else word
        if text_width(trial) <= width:
            line = trial
            continue
        if line:
            lines.append(line)
        line = ""
        for ch in word:  # a word wider than the column on its own
            if text_width(line + ch) > width and line:
                lines.append(line)
                line = ""
            line += ch
    if line or not lines:
        lines.append(line)
    return lines


LABEL_GAP = 8  # pixels between a Shapley label and the plot area
LABEL_MAX = 0.45  # the share of the plot's width the label column may take before wrapping


def shapley_plot(values: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Horizontal bars: each step's Shapley value with its interval. The label column is as
    wide as its longest label (measured, not guessed from a fixed margin); a label wider than
    ``LABEL_MAX`` of the plot wraps onto more lines and its row grows to hold them."""
    values = [v for v in values if v.get("estimate") is not None]
    if not values:
        return {}
    labels = [str(v.get("label") or f"step {v.get('step')}") for v in values]
    cap = PLOT_W * LABEL_MAX
    widest = max(text_width(t) for t in labels)
    left = LABEL_GAP + math.ceil(min(widest, cap)) + LABEL_GAP
    lines = [wrap_label(t, cap) if text_width(t) > cap else [t] for t in labels]
    line_h = FONT_PX * 1.25
    rows = [max(28.0, len(ls) * line_h + 10) for ls in lines]
    h = MARGIN["top"] + math.ceil(sum(rows)) + MARGIN["bottom"]
    lows = [v["ci"][0] for v in values if v.get("ci")]
    highs = [v["ci"][1] for v in values if v.get("ci")]
    x = _Axis(*_range(lows + highs + [v["estimate"] for v in values]), left,
              PLOT_W - MARGIN["right"])
    bars = []
    top = float(MARGIN["top"])
    for v, label, ls, row in zip(values, labels, lines, rows, strict=True):
        cy = top + row / 2
        top += row
        lo, hi = v.get("ci") or (v["estimate"], v["estimate"])
        x0, x1 = sorted((x(0.0), x(v["estimate"])))
        first = cy - (len(ls) - 1) * line_h / 2 + FONT_PX / 3  # baseline of the first line
        bars.append({"y": round(cy - 8.4, 2), "h": 16.8, "cy": round(cy, 2),
                     "x": x0, "w": round(max(x1 - x0, 1.0), 2), "x_lo": x(lo), "x_hi": x(hi),
                     "label": label, "lines": [{"text": t, "y": round(first + i * line_h, 2)}
                                               for i, t in enumerate(ls)],
                     "negative": v["estimate"] < 0,
                     "title": f"{label}: φ = {fmt.num(v['estimate'])} "
                              f"{fmt.interval(v.get('ci'))}, n={v.get('n', '?')}"})
    return {"w": PLOT_W, "h": h, "m": MARGIN, "left": left, "label_x": left - LABEL_GAP,
            "zero": x(0.0), "ticks": x.ticks(), "bars": bars, "axis_y": h - MARGIN["bottom"]}


__all__ = ["LABEL_GAP", "LABEL_MAX", "MARGIN", "PLOT_H", "PLOT_W", "UNTESTED_FILL", "arms_plot",
           "rescue_plot", "shapley_plot", "text_width", "wrap_label"]
