"""``python -m car_core.cli``: the ``car`` command."""

import sys

from car_core.cli import main

sys.exit(main())
