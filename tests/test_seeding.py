"""Noise streams: named by ``Stream`` members only, drawn from spawn keys that never change (every
stored seed and recorded run depends on them), one independent stream per draw of a step."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from car_core.errors import InvalidInput
from car_core.model.seeding import Noise, Stream

ROOT = Path(__file__).resolve().parents[1]

# The spawn-key number of each stream, as runs and seeds were recorded with it.
RECORDED_NUMBERS = {Stream.POLICY: 0, Stream.ENVIRONMENT: 1, Stream.OUTCOME: 2, Stream.MODEL: 3}


@pytest.mark.parametrize("stream", list(Stream))
def test_a_stream_draws_from_its_recorded_spawn_key(stream: Stream) -> None:
    noise = Noise(7, (1, 3))
    expected = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        entropy=7, spawn_key=(1, 3, 4, RECORDED_NUMBERS[stream])))).random(5)
    assert noise.rng(4, stream).random(5).tolist() == expected.tolist()
    # a member is its string, so a caller that still passes the word draws the same numbers
    assert noise.rng(4, stream.value).random(5).tolist() == expected.tolist()  # type: ignore[arg-type]


def test_every_stream_is_listed_with_its_number() -> None:
    assert set(RECORDED_NUMBERS) == set(Stream)


def test_the_streams_of_a_step_are_distinct() -> None:
    noise = Noise(0)
    draws = {s: noise.rng(2, s).random() for s in Stream}
    assert len(set(draws.values())) == len(Stream)


def test_the_model_seed_comes_from_the_model_stream() -> None:
    noise = Noise(5, (2, 9, 1))
    assert noise.int_seed(3) == int(noise.rng(3, Stream.MODEL).integers(0, 2**31 - 1))


def test_an_unknown_stream_is_refused_by_name() -> None:
    with pytest.raises(InvalidInput, match="unknown noise stream 'tool'"):
        Noise(0).rng(0, "tool")  # type: ignore[arg-type]


def _literal_stream_calls(path: Path, root: Path = ROOT) -> list[str]:
    """``x.rng(k, "word")`` / ``x.int_seed(k, "word")`` calls: a stream spelled as a string."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("rng", "int_seed") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_source_names_a_stream_with_a_string() -> None:
    sources = [p for folder in ("car_core", "adapters", "benchmarks", "examples", "tests",
                                "integrations_tests")
               for p in sorted((ROOT / folder).rglob("*.py"))
               if p != Path(__file__).resolve()]  # this file spells one on purpose
    assert len(sources) > 50
    assert [hit for p in sources for hit in _literal_stream_calls(p)] == []


def test_the_literal_finder_sees_a_literal(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text('noise.rng(0, "outcome")\nnoise.rng(0, Stream.OUTCOME)\nrng.integers(0, 9)\n')
    assert _literal_stream_calls(src, tmp_path) == ["m.py:1"]
