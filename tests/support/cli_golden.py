"""What the ``car`` commands that read attribution results print, on planted runs, with what
varies between runs (ids, digests, dates, seconds) masked, so two versions of CAR can be
compared byte for byte.

``python tests/support/cli_golden.py`` writes the outputs to ``tests/golden/cli/``; those files
were written by the code before the store and the commands read typed results, and
``tests/test_cli_golden.py`` checks that the commands still print exactly that. Rewrite them
only for a deliberate change of output, and say so in the commit.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "cli"

_ID = re.compile(r"\b[0-9a-f]{64}\b|\b[0-9a-f]{16}\b")
_SECONDS = re.compile(r"rollouts in \d+\.\ds")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?( UTC)?")
_STAMP = re.compile(r'"(created_at|finished_at)": [0-9.e+]+')


class _Masker:
    """Ids become ``<id N>`` in the order they first appear, so the same id reads the same
    in every output."""

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        def name(m: re.Match[str]) -> str:
            return self.ids.setdefault(m.group(), f"<id {len(self.ids) + 1}>")
        text = _ID.sub(name, text)
        text = _SECONDS.sub("rollouts in <s>s", text)
        text = _STAMP.sub(lambda m: f'"{m.group(1)}": <time>', text)
        return _DATE.sub("<date>", text)


def _car(*argv: str) -> tuple[int, str, str]:
    from car_core import cli
    stdout, stderr = io.StringIO(), io.StringIO()
    argv0, widths = sys.argv, (cli.out.width, cli.err.width)
    sys.argv = ["car", *argv]  # what the resume hint repeats
    cli.out.width, cli.err.width = 120, 120  # as piped with COLUMNS unset, whatever the shell
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = cli.main(list(argv))
    finally:
        sys.argv = argv0
        cli.out.width, cli.err.width = widths
    return code, stdout.getvalue(), stderr.getvalue()


def capture(folder: Path) -> dict[str, str]:
    """Record planted runs (pivot, no cause, AND game) in ``folder/car.db``, attribute them
    through the command (contrastive, truncated, no locus, Shapley), then list the
    attributions and write the reports: every command's exit code, stdout and stderr (and
    the HTML written), masked."""
    from car_core.store import RunStore
    from car_core.testing import synthetic as syn

    db = str(folder / "car.db")
    pivot, game = syn.pivot().failing_run(0), syn.and_game().failing_run(0)
    nothing = syn.no_cause().failing_run(0)
    with RunStore(db) as s:
        for run in (pivot, game, nothing):
            s.save(run)
    mask = _Masker()
    for run in (pivot, game, nothing):
        mask(run.id)
    commands: list[tuple[str, tuple[str, ...], Path | None]] = [
        ("attribute_contrastive_json", ("attribute", pivot.id, "--agent",
                                        "car_core.synthetic:pivot", "--rollouts", "16",
                                        "--json"), None),
        ("attribute_contrastive_table", ("attribute", pivot.id, "--agent",
                                         "car_core.synthetic:pivot", "--rollouts", "16"), None),
        ("attribute_truncated_table", ("attribute", pivot.id, "--agent",
                                       "car_core.synthetic:pivot", "--budget", "5"), None),
        ("attribute_no_locus_table", ("attribute", nothing.id, "--agent",
                                      "car_core.synthetic:no_cause"), None),
        ("attribute_shapley_json", ("attribute", game.id, "--agent",
                                    "car_core.synthetic:and_game", "--method", "shapley",
                                    "--budget", "400", "--json"), None),
        ("attribute_shapley_table", ("attribute", game.id, "--agent",
                                     "car_core.synthetic:and_game", "--method", "shapley",
                                     "--budget", "400", "--seed", "1"), None),
        ("attributions_table", ("attributions", "--store", db), None),
        ("attributions_json", ("attributions", "--store", db, "--json"), None),
        ("attributions_pivot_json", ("attributions", pivot.id, "--store", db, "--json"), None),
        ("report_latest", ("report", pivot.id, "--store", db, "--out",
                           str(folder / "latest.html")), folder / "latest.html"),
        ("report_shapley", ("report", game.id, "--store", db, "--method", "shapley", "--out",
                            str(folder / "shapley.html")), folder / "shapley.html"),
        # last, so that the attribution it adds is in no listing above
        ("attribute_contrastive_explain", ("attribute", pivot.id, "--agent",
                                           "car_core.synthetic:pivot", "--rollouts", "16",
                                           "--explain"), None),
    ]
    outputs: dict[str, str] = {}
    for name, argv, html in commands:
        if argv[0] == "attribute":
            argv = (*argv, "--store", db)
        code, out, err = _car(*argv)
        text = f"exit {code}\n--- stdout\n{out}--- stderr\n{err}"
        if html is not None:
            text += f"--- {html.name}\n{html.read_text(encoding='utf-8')}"
        outputs[name] = mask(text.replace(str(folder), "<folder>"))
    return outputs


def main(argv: list[str]) -> int:
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        outputs = capture(Path(tmp))
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, text in outputs.items():
        (GOLDEN / f"{name}.txt").write_text(text, encoding="utf-8")
    print(f"wrote {len(outputs)} outputs to {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__: list[Any] = ["GOLDEN", "capture"]
