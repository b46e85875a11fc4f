"""The attribution table at the terminal's width: on 80 columns the step, what it did, rescue
and interval stay readable (they were squeezed to nothing beside the P(fail) columns), and the
table says which columns it left out; a wide terminal shows every column."""

from __future__ import annotations

import pytest
from rich.console import Console

import car_core as car
from car_core import formatting as fmt
from car_core.cli import kit
from car_core.testing import synthetic as syn


@pytest.fixture(scope="module")
def located() -> car.ContrastiveResult:
    m = syn.pivot()
    return car.contrastive(m.failing_run(0), m.agent(), outcome=m.outcome, rollouts=64, seed=0,
                           progress=False)


def _printed(r: car.ContrastiveResult, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(kit.attribution_table(r, width))
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 100])
def test_a_narrow_terminal_keeps_the_step_rescue_and_interval(located, width) -> None:
    lines = _printed(located, width)
    assert all(len(line) <= width for line in lines)
    s = located.steps[located.locus]
    row = next(line for line in lines if fmt.LOCUS_MARK in line)
    assert f"│    {located.locus} │ chose" in row  # the step, whole, and what it did
    assert fmt.effect(s.effect) in row and fmt.effect_interval(s.ci) in row
    assert fmt.HELD not in "".join(lines)
    assert "P(fail) columns left out at this width: --explain has them" in " ".join(lines)


def test_a_wide_terminal_shows_every_column(located) -> None:
    lines = _printed(located, 120)
    assert fmt.HELD in lines[2] and fmt.REDRAWN in lines[2]
    assert "left out" not in " ".join(lines)
