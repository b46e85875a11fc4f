"""sqlite-utils, imported without pandas.

sqlite-utils imports pandas whenever it is installed, only to map ``pandas.Timestamp`` to a
column type — a value the store never writes — and that import costs more than the rest of
``car`` together. Unless pandas is already loaded (then sqlite-utils gets it, as usual), it is
hidden while sqlite-utils loads; pandas itself stays importable afterwards.
"""

from __future__ import annotations

import sys

_hide = "pandas" not in sys.modules
if _hide:
    sys.modules["pandas"] = None  # type: ignore[assignment]  # makes `import pandas` fail
try:
    import sqlite_utils
    from sqlite_utils.migrations import Migrations as sqlite_utils_migrations
finally:
    if _hide and sys.modules.get("pandas", 0) is None:
        del sys.modules["pandas"]

__all__ = ["sqlite_utils", "sqlite_utils_migrations"]
