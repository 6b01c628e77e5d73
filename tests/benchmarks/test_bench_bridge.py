"""The bridge benchmark runs end to end in a tiny configuration (no timing assertions:
only that every row was measured, through a real ``polymux bridge`` process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


def test_bridge_benchmark_measures_every_row() -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_bridge.py", "--mib", "1", "--repeat", "1",
         "--pairs", "mplex>yamux,yamux>mstream-v3", "--json"],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {(r["pair"], r["channels"]) for r in rows} == {
        (pair, n) for pair in ("mplex>yamux", "yamux>mstream-v3") for n in (1, 16)
    }
    for row in rows:
        assert row["direct_a_mib_s"] > 0 and row["direct_b_mib_s"] > 0 and row["bridged_mib_s"] > 0, row
        assert abs(row["ratio"] - row["bridged_mib_s"] / row["direct_b_mib_s"]) < 0.02, row
