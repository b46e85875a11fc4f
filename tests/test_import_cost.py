"""``import car_core`` loads no heavy dependency: scipy comes with the first estimate and
sqlite-utils (with pandas, which it would import for a type the store never writes) with the
first store. What that saves is measured in ``benchmarks/import_cost.py``, not here."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("scipy", "sqlite_utils", "pandas")


def _loaded_after(code: str) -> set[str]:
    probe = (f"import sys; {code}; "
             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


def test_import_car_core_loads_no_heavy_dependency() -> None:
    assert _loaded_after("import car_core") & set(HEAVY) == set()


def test_the_store_loads_sqlite_utils_without_pandas() -> None:
    loaded = _loaded_after("import car_core; car_core.RunStore")
    assert "sqlite_utils" in loaded and "pandas" not in loaded


def test_a_store_still_works_after_pandas_was_imported(tmp_path) -> None:
    # a user who imported pandas first gets sqlite-utils with it, as sqlite-utils wants
    loaded = _loaded_after(f"import pandas, car_core; car_core.RunStore({str(tmp_path / 'r.db')!r})"
                           ".close()")
    assert {"pandas", "sqlite_utils"} <= loaded
