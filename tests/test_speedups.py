"""The compiled data plane and its pure-Python twin (``polymux._speedups``, ``setup.py``).

* The path in use is the one asked for: ``POLYMUX_NO_EXTENSIONS=1`` imports every module of
  the data plane from its ``.py`` source, whatever is built; a build without a compiler
  runs on the twin too and says so (``polymux --version`` names the path).
* Both paths do the same with the same bytes: the transcript of ``speedups_transcript.py``
  (every format, the fuzz corpus cut at many offsets and in pieces: events, bytes sent,
  inboxes) is the same line for line from each.
* 10 million frames through the data plane leave memory where it was.
* The pure-Python path stays thin: at most 25 Python calls to receive, read and credit one
  data frame, at most 20 to write one, on every format (``benchmarks/calls.py``).

``scripts/test`` builds the extension first and runs the whole suite on it, then the wire,
engine, session and interop tests again with ``POLYMUX_NO_EXTENSIONS=1``; where no
compiler is there these tests run both transcripts on the twin, and say so.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from polymux import _speedups


ROOT = Path(__file__).resolve().parents[1]
TWIN = {**os.environ, "POLYMUX_NO_EXTENSIONS": "1"}
BUILT = {k: v for k, v in os.environ.items() if k != "POLYMUX_NO_EXTENSIONS"}


def _python(code: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _extension_built() -> bool:
    return _python("import polymux, polymux._speedups as s; print(s.compiled())", BUILT) == "True"


def test_no_extensions_imports_every_module_of_the_data_plane_from_its_source() -> None:
    out = _python(
        "import importlib, polymux, polymux._speedups as s\n"
        "for name in s.COMPILED_MODULES: print(importlib.import_module(name).__file__)\n"
        "print(s.path())",
        TWIN,
    )
    *files, path = out.splitlines()
    assert len(files) == len(_speedups.COMPILED_MODULES)
    assert all(f.endswith(".py") for f in files), files
    assert path == "pure Python (POLYMUX_NO_EXTENSIONS is set)"


def test_the_version_names_the_path_in_use() -> None:
    """``polymux --version`` says which path runs (here: the twin, as asked)."""
    done = subprocess.run(
        [sys.executable, "-m", "polymux", "--version"],
        check=False,
        env=TWIN,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "pure Python (POLYMUX_NO_EXTENSIONS is set)" in done.stdout


def test_a_built_extension_is_what_runs() -> None:
    """Where the extension is built (scripts/test builds it), every module of the data
    plane is its compiled form."""
    if not _extension_built():
        # scripts/test sets POLYMUX_REQUIRE_COMPILED=1 where it built the extension: a build
        # that failed there fails here, never skips.
        assert not os.environ.get("POLYMUX_REQUIRE_COMPILED"), "the extension is not built"
        pytest.skip("the extension is not built here (no C compiler): the twin runs, tested throughout")
    out = _python(
        "import importlib, polymux, polymux._speedups as s\n"
        "for name in s.COMPILED_MODULES: print(importlib.import_module(name).__file__)",
        BUILT,
    )
    assert all(not f.endswith(".py") for f in out.splitlines()), out


@pytest.mark.timeout(600)
def test_both_paths_do_the_same_with_the_same_bytes() -> None:
    """The transcripts of the compiled path and of the twin are the same, line for line
    (on a machine without the extension both are the twin's: the test still runs the
    transcript, which must not fail)."""
    script = str(ROOT / "tests" / "speedups_transcript.py")
    runs = {}
    for label, env in (("compiled", BUILT), ("twin", TWIN)):
        done = subprocess.run(
            [sys.executable, script],
            check=False,
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=540,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        runs[label] = done.stdout.splitlines()
    compiled, twin = runs["compiled"], runs["twin"]
    assert compiled[0].startswith("# path: compiled") or not _extension_built(), compiled[0]
    assert twin[0] == "# path: pure Python (POLYMUX_NO_EXTENSIONS is set)"
    assert len(compiled) == len(twin) > 10_000
    for a, b in zip(compiled[1:], twin[1:], strict=True):
        assert a == b, f"compiled: {a}\ntwin:     {b}"


@pytest.mark.timeout(300)
def test_ten_million_frames_leave_memory_flat() -> None:
    """10,000,000 data frames (of 1 to 16 bytes, in 256 KiB reads) through a session core,
    into an inbox that is read as they come: memory after them is what it was after the
    first 100,000 (every buffer, inbox part and count released)."""
    from polymux import SessionConfig
    from polymux.formats import make_engine
    from polymux.session import SessionCore, events as ce
    from polymux.wire import mplex

    config = SessionConfig(keepalive_interval=None, idle_timeout=None)
    core = SessionCore(make_engine("mplex", config, is_client=False), config, 0.0, has_handler=True)
    core.connection_made(0.0)
    core.receive_data(mplex.encode_header(1, 0) + b"\x00", 0.0)  # NewStream 1
    (incoming,) = [e for e in core.events() if isinstance(e, ce.Incoming)]
    inbox = core.stream(incoming.handle, owner=None)
    assert inbox is not None
    frames = [mplex.encode_header(1, 2) + bytes([n]) + bytes(n) for n in range(1, 17)]
    block = b"".join(frames)
    per_read = (256 * 1024) // len(block)
    read = block * per_read
    frames_per_read = per_read * len(frames)
    total = 10_000_000
    reads = total // frames_per_read + 1
    baseline = 0
    tracemalloc.start()
    try:
        for i in range(reads):
            core.receive_data(read, 0.0)
            while inbox.size:
                inbox.take(1 << 20)
            core.report(0.0)
            core.data_to_send()
            if i == 100_000 // frames_per_read:
                gc.collect()
                baseline = tracemalloc.get_traced_memory()[0]
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert reads * frames_per_read >= total
    assert not core.failed, core.error
    assert inbox.unconsumed == 0 and core.budget.unread <= inbox.pending
    assert after - baseline < 64 * 1024, (baseline, after)


def test_the_pure_python_path_stays_thin() -> None:
    """At most 25 Python calls to receive, read and credit one data frame, at most 20 to
    write one, on every format (the twin: compiled code makes no Python calls to count)."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.calls"],
        check=False,
        env=TWIN,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:] if line.strip()]
    assert len(rows) >= 11, done.stdout
    for fmt, receive, write in rows:
        assert int(receive) <= 25, f"{fmt}: {receive} calls to receive a frame\n{done.stdout}"
        assert int(write) <= 20, f"{fmt}: {write} calls to write a frame\n{done.stdout}"
