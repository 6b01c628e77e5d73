"""The benchmark suite runs end to end in a tiny configuration and writes its reports
(no timing assertions: only that every scenario produced its rows and files)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polymux.cli import bench as cli_bench, main as cli_main


ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--quick",
    "--formats", "mplex,mstream-v3",
    "--loops", "asyncio",
    "--transports", "tcp",
    "--bulk-mib", "1",
    "--bulk-channels", "1,4",
    "--repeat", "1",
    "--messages", "200",
    "--seconds", "0.05",
    "--scale-counts", "50",
    "--slow-mib", "1",
    "--no-node",
    "-q",
]  # fmt: skip


def _run_suite(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *TINY, *extra, "--out", str(out)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )


def test_quick_suite_writes_markdown_json_and_plots(tmp_path: Path) -> None:
    proc = _run_suite(tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    data = json.loads((tmp_path / "results.json").read_text())
    assert data["meta"]["mode"] == "quick"
    rows = data["rows"]
    assert all(not r["errors"] for r in rows), [r["errors"] for r in rows if r["errors"]]
    got = {(r["scenario"], r["case"], r["stack"]) for r in rows}
    for case in ("1 ch", "4 ch"):
        for stack in ("raw-streams", "raw-protocol", "mplex", "mstream-v3"):
            assert ("bulk", case, stack) in got
    for stack in ("raw-streams", "mplex", "mstream-v3"):
        assert ("messages", "64 B x 1 ch", stack) in got
        assert ("messages", "1024 B x 1 ch", stack) in got
        assert ("rr", "64 B x 1 ch", stack) in got
        assert ("rr", "64 B x 64 ch", stack) in got
        assert ("churn", "1 KiB x 16 workers", stack) in got
        assert ("slow reader", "1 MiB, 2000 us/64 KiB read", stack) in got
    for fmt in ("mplex", "mstream-v3"):
        assert ("scale", "50 idle ch", fmt) in got
    # Every polymux row has a ratio against the raw baseline of the same run.
    for r in rows:
        if r["scenario"] in ("bulk", "messages", "rr", "churn") and r["stack"] != "raw-streams":
            assert r["baseline"] == "raw-streams"
            assert r["ratio"] is not None and r["ratio"] > 0, r
        if r["scenario"] == "scale":
            assert r["extra"]["tracemalloc_per_ch"] > 0
            assert set(r["extra"]) >= {"rss_per_ch", "peer_rss_per_ch", "open_s"}

    md = (tmp_path / "results.md").read_text()
    for heading in (
        "## Targets",
        "## bulk",
        "## messages",
        "## rr",
        "## churn",
        "## scale",
        "## slow reader",
    ):
        assert heading in md
    assert "| asyncio | tcp | 1 ch | mplex |" in md
    # Sender and receiver on CPUs of their own where the machine has two (CI has).
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) >= 2:
        assert f"- pinned: sender on CPU {cpus[0]}, receiver on CPU {cpus[-1]}" in md
        assert data["meta"]["pinned"].startswith("sender on CPU")
    assert "| asyncio | tcp | 64 B x 1 ch | mstream-v3 |" in md

    for stem in ("bulk_vs_channels", "messages_vs_size", "rr_vs_channels"):
        png = tmp_path / f"{stem}_asyncio_tcp.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_options_are_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--formats", "nosuch", "--out", str(tmp_path)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "unknown format" in proc.stderr and "nosuch" in proc.stderr
    assert not (tmp_path / "results.json").exists()


def test_polymux_bench_runs_the_suite_from_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # outside the checkout: found next to the (editable) package
    assert cli_bench.find_suite() == ROOT
    out = tmp_path / "out"
    status = cli_main(
        ["bench", "--formats", "mplex", "--scenarios", "churn", "--loops", "asyncio", "--transports", "tcp",
         "--seconds", "0.05", "--repeat", "1", "--no-node", "--quiet", "--out", str(out)]
    )  # fmt: skip
    assert status == 0, capfd.readouterr()
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["stack"] for r in rows} == {"raw-streams", "mplex"}
    assert json.loads((out / "results.json").read_text())["meta"]["mode"] == "quick"


def test_polymux_bench_without_a_checkout_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_bench, "find_suite", lambda start=None: None)
    assert cli_main(["bench"]) == 1  # the suite is an input that is missing
    err = capsys.readouterr().err
    assert "cannot find the benchmark suite" in err
    assert "git clone https://github.com/polymux/polymux;" in err and "..." not in err


def test_the_suite_without_matplotlib_keeps_its_results(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without the bench extra a run keeps its tables and results.json and says what to install
    for the plots (it ran for minutes, then died on ``import matplotlib``)."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import report
    finally:
        sys.path.remove(str(ROOT))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ModuleNotFoundError
    assert report.plots_if_possible(tmp_path, []) == ([], report.NO_PLOTS)
    assert "pip install 'polymux[bench]'" in report.NO_PLOTS and not list(tmp_path.iterdir())


def test_node_reference_rows_move_the_bytes() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.node_ref import node_available, node_bulk
    finally:
        sys.path.remove(str(ROOT))
    assert node_available() is None, node_available()  # scripts/setup --with-node

    async def both() -> list[float]:
        async with asyncio.timeout(60):
            return [await node_bulk(fmt, 1 << 20, 30.0) for fmt in ("mplex", "mstream-v3")]

    rates = asyncio.run(both())
    assert all(r > 0 for r in rates), rates


@pytest.mark.parametrize("fmt", ["yamux", "smux", "smux-v2"])
def test_go_reference_rows_move_the_bytes(fmt: str) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.go_ref import go_available, go_bulk
    finally:
        sys.path.remove(str(ROOT))
    assert go_available() is None, go_available()  # scripts/setup --with-system

    async def both() -> list[float]:
        async with asyncio.timeout(60):
            return [await go_bulk(fmt, 1 << 20, n, 30.0) for n in (1, 4)]

    rates = asyncio.run(both())
    assert all(r > 0 for r in rates), rates


def test_the_suite_reports_polymux_against_the_go_library(tmp_path: Path) -> None:
    """yamux bulk rows come with hashicorp/yamux Go-to-Go rows of the same run, at every
    channel count, and a polymux / Go line each in the targets."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--formats", "yamux", "--scenarios", "bulk", "--loops", "asyncio",
         "--transports", "tcp", "--bulk-mib", "1", "--bulk-channels", "1,4", "--repeat", "1", "--no-node",
         "-q", "--out", str(tmp_path)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads((tmp_path / "results.json").read_text())
    go_rows = {r["case"]: r for r in data["rows"] if r["stack"] == "yamux>go"}
    assert set(go_rows) == {"1 ch", "4 ch"}, [r["stack"] for r in data["rows"]]
    assert all(r["values"] and not r["errors"] for r in go_rows.values()), go_rows
    assert data["meta"]["go"] == "used for bulk (tcp)"
    md = (tmp_path / "results.md").read_text()
    for case in ("1 ch", "4 ch"):
        assert f"| bulk {case}: polymux / the Go library (>= 1x) | asyncio | tcp | yamux |" in md
