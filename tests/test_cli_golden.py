"""The commands that read attribution results print what they printed before the store and
the command handed typed results around: the files in ``tests/golden/cli/`` were written by
the earlier code on the same planted runs (``tests/support/cli_golden.py``), and every output
must match them byte for byte once ids, dates and seconds are masked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from cli_golden import GOLDEN, capture  # noqa: E402


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return capture(tmp_path_factory.mktemp("golden"))


def test_every_golden_output_is_produced(outputs: dict[str, str]) -> None:
    assert sorted(outputs) == sorted(p.stem for p in GOLDEN.glob("*.txt"))


@pytest.mark.parametrize("name", sorted(p.stem for p in GOLDEN.glob("*.txt")))
def test_output_is_byte_identical_to_the_golden_one(outputs: dict[str, str], name: str) -> None:
    assert outputs[name] == (GOLDEN / f"{name}.txt").read_text(encoding="utf-8")
