"""Where the benchmarks find the shared data sets (UCI Adult with its ARX hierarchies, Li et
al.'s example): ``$SABRE_DATA``, else ``data/`` of the ``shared`` folder beside the project's
root -- the layout of the development machines and of CI."""
from __future__ import annotations

import os
from pathlib import Path

SHARED_DATA = Path(os.environ.get("SABRE_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
ADULT = SHARED_DATA / "adult"
