"""The ``car`` console script's entry point, outside ``car_core``: importing the command takes a
second or two, and a Ctrl-C in that time must end like a Ctrl-C anywhere else in the command
(one line, exit 130), which only code that runs before those imports can promise."""

from __future__ import annotations

import sys

INTERRUPTED = 130  # car_core.cli.kit.INTERRUPTED, not imported: that is what may be interrupted


def main() -> int:
    try:
        from car_core.cli import main as command
    except KeyboardInterrupt:
        sys.stderr.write("car: error: interrupted\n")
        return INTERRUPTED
    return command()


if __name__ == "__main__":
    sys.exit(main())
