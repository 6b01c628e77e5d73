"""The fuzz suite drives the same targets as the atheris harnesses in ``fuzz/``."""

from __future__ import annotations

import sys
from pathlib import Path


FUZZ_DIR = Path(__file__).resolve().parents[2] / "fuzz"
if str(FUZZ_DIR) not in sys.path:
    sys.path.insert(0, str(FUZZ_DIR))
