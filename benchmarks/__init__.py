"""polymux's benchmark suite: ``python -m benchmarks [--quick|--full] ...`` (see
benchmarks/README.md). Scenario code lives in :mod:`benchmarks.scenarios`, the receiving
process in :mod:`benchmarks.peer`, the reports in :mod:`benchmarks.report`."""

from __future__ import annotations
