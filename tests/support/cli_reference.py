"""The CLI reference in docs/cli.md, generated from the parsers: ``car <command> --help`` for
every command, as the installed ``car`` prints it.

The commands are read from ``car --help`` itself (and a group's from its own ``--help``), so a
new command appears here without this script knowing its name. ``python
tests/support/cli_reference.py --write`` rewrites the part of docs/cli.md between the two
markers; ``tests/test_cli_reference.py`` fails when that part differs from what the parsers
print now.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"
CAR = Path(sys.executable).parent / "car"
START = "<!-- cli-reference: start -->"
END = "<!-- cli-reference: end -->"


def _help(words: list[str]) -> str:
    """``car WORDS --help`` as a 100-column terminal without colour shows it."""
    env = dict(os.environ, COLUMNS="100", NO_COLOR="1", TERM="dumb")
    env.pop("FORCE_COLOR", None)
    done = subprocess.run([str(CAR), *words, "--help"], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    return "\n".join(line.rstrip() for line in done.stdout.strip("\n").splitlines())


def _commands(text: str) -> list[str]:
    """The command names a help text lists under ``Commands:``, in its order."""
    names, inside = [], False
    for line in text.splitlines():
        if line.strip() == "Commands:":
            inside = True
        elif inside and not line.strip():
            break
        elif inside and (m := re.match(r"^  (\S+)(\s{2,}|$)", line)):
            names.append(m.group(1))
    return names


def _sections(words: list[str]) -> list[tuple[list[str], str]]:
    """``car WORDS --help`` and every subcommand's, depth first."""
    text = _help(words)
    found = [(words, text)]
    for name in _commands(text):
        found += _sections([*words, name])
    return found


def render() -> str:
    """The reference: one heading and one help block per command."""
    parts = []
    for words, text in _sections([]):
        command = " ".join(["car", *words])
        heading = "###" if len(words) < 2 else "####"
        parts.append(f"{heading} `{command}`\n\n<!-- help: {command} -->\n```\n{text}\n```")
    return "\n\n".join(parts)


def current() -> str:
    """What docs/cli.md holds between the markers now."""
    text = PAGE.read_text(encoding="utf-8")
    return text[text.index(START) + len(START):text.index(END)].strip("\n")


def write() -> None:
    text = PAGE.read_text(encoding="utf-8")
    head, tail = text[:text.index(START) + len(START)], text[text.index(END):]
    PAGE.write_text(f"{head}\n{render()}\n{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the reference in docs/cli.md")
    if parser.parse_args(argv).write:
        write()
    else:
        print(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
