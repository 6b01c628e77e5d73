"""A short atheris run of every harness and format (CI budget): fails on any crash.

The long runs (1,000,000 executions per format) are done by hand with
``fuzz/run_all.sh``; their results are in ``fuzz/README.md``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

import polymux


pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(300)]

FUZZ_DIR = Path(__file__).resolve().parents[2] / "fuzz"
RUNS = {"engine": int(os.environ.get("POLYMUX_ATHERIS_RUNS", "2000")), "codec": 1000}


async def _run(harness: str, fmt: str, tmp: Path) -> tuple[int, str]:
    work = tmp / f"{harness}-{fmt}"
    work.mkdir()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(FUZZ_DIR / f"fuzz_{harness}.py"),
        "--format",
        fmt,
        "--seed-corpus",
        f"-atheris_runs={RUNS[harness]}",
        "-max_len=1024",
        # A per-input alarm far beyond the whole run: on a loaded machine libFuzzer's
        # SIGALRM killed healthy runs (exit -14 after "Done", or 77 "Timeout: 1s" with
        # -timeout=0, which libFuzzer does not take as "off"); a hang is caught by the
        # wait_for below.
        "-timeout=600",
        "-rss_limit_mb=1024",
        f"-artifact_prefix={tmp}/crash-{harness}-{fmt}-",
        str(work),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 240)
    return proc.returncode or 0, out.decode(errors="replace")


@pytest.mark.parametrize("harness", ["engine", "codec"])
async def test_atheris_short_run(harness: str, tmp_path: Path) -> None:
    """Every format, two at a time; libFuzzer exits non-zero on a crash or an RSS over
    the limit, and a run that hangs fails the wait_for."""
    import atheris  # noqa: F401 - a missing atheris must fail this test, never skip it

    sem = asyncio.Semaphore(2)

    async def one(fmt: str) -> tuple[str, int, str]:
        async with sem:
            rc, out = await _run(harness, fmt, tmp_path)
        return fmt, rc, out

    results = await asyncio.gather(*(one(fmt) for fmt in polymux.PROTOCOLS))
    for fmt, rc, out in results:
        done = f"Done {RUNS[harness]} in " in out
        # libFuzzer prints "Done" only once every run passed. A SIGALRM after it (exit -14:
        # seen on a loaded machine even with -timeout=0, during interpreter teardown) ends
        # a run that already succeeded; before "Done" it is a failure like any other.
        assert rc == 0 or (rc == -signal.SIGALRM and done), (
            f"{harness} {fmt}: atheris exited with {rc}:\n{out[-4000:]}"
        )
        assert done, f"{harness} {fmt}:\n{out[-2000:]}"
