"""The forward benchmark runs end to end in a tiny configuration (no timing assertions:
only that every row was measured, through real ``polymux forward`` processes; the ssh
column where the machine has sshd and ssh, and otherwise a note saying why not)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


def test_forward_benchmark_measures_every_row() -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/bench_forward.py", "--mib", "1", "--repeat", "1",
         "--protocols", "yamux,mplex", "--json"],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    rows, note = result["rows"], result["note"]
    assert {(r["protocol"], r["connections"]) for r in rows} == {
        (protocol, n) for protocol in ("yamux", "mplex") for n in (1, 16)
    }
    for row in rows:
        assert row["direct_mib_s"] > 0 and row["forward_mib_s"] > 0, row
        assert abs(row["vs_direct"] - row["forward_mib_s"] / row["direct_mib_s"]) < 0.02, row
        if note.startswith("ssh -L not measured"):
            assert row["ssh_mib_s"] is None, (row, note)
        else:
            assert row["ssh_mib_s"] > 0 and note.startswith("ssh -L: OpenSSH"), (row, note)
