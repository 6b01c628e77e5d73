"""``polymux demo`` (what ``scripts/demo`` runs), without a terminal: a real file
transfer to an embedded server, plain progress lines, the summary with the throughput."""

from __future__ import annotations

import re

import pytest

import polymux

from .procs import Procs


async def test_demo_default_without_a_tty(procs: Procs) -> None:
    demo = await procs.polymux("demo")
    assert await demo.wait(timeout=90) == 0, demo.describe()
    out = demo.stdout
    assert re.search(
        r"16 files, 64\.0 MiB in all, one channel per file .*\n  over one mstream-v3 connection", out
    )
    assert re.search(
        r"^progress +\d+\.\d% .* MB/s$", out, re.MULTILINE
    )  # plain progress lines, no escape codes
    assert "\x1b[" not in out
    assert out.count("  done      ") == 16
    assert re.search(
        r"16/16 files verified \(SHA-256\), 64\.0 MiB in all; sent 64\.0 MiB in [\d.]+ s = [\d.]+ MB/s", out
    )
    assert "16/16 identical to the originals" in out


async def test_demo_other_format_rich_progress(procs: Procs) -> None:
    demo = await procs.polymux(
        "demo", "--protocol", "yamux", "--files", "3", "--size", "2MiB", "--progress", "rich"
    )
    assert await demo.wait(timeout=60) == 0, demo.describe()
    assert "total" in demo.stdout and "3/3 files" in demo.stdout
    assert "3/3 identical to the originals" in demo.stdout


@pytest.mark.parametrize("protocol", polymux.PROTOCOLS)
async def test_demo_on_every_format_cut_and_resumed(procs: Procs, protocol: str) -> None:
    """The demo with default settings on every format, its connection cut part-way and
    resumed on a new one: every file verified. omnistreams, whose streams are one-way,
    carries each file on a pair of streams; Streamux's embedded receiver answers before
    the request ends (both ends are polymux). A resumed offer that arrives before the
    server has seen the old connection's end (formats without credit see it only after
    the data before it) waits for the earlier transfer instead of being refused."""
    demo = await procs.polymux(
        "demo", "--protocol", protocol, "--files", "6", "--total", "12MiB", "--interrupt", "40"
    )
    assert await demo.wait(timeout=60) == 0, demo.describe()
    assert "6/6 files verified (SHA-256)" in demo.stdout, demo.describe()
    assert "6/6 identical to the originals" in demo.stdout


async def test_demo_interrupted_and_resumed(procs: Procs) -> None:
    demo = await procs.polymux(
        "demo", "--files", "6", "--size", "12MiB", "--interrupt", "40", "--progress", "plain"
    )
    assert await demo.wait(timeout=60) == 0, demo.describe()
    out = demo.stdout
    m = re.search(
        r"^-- the connection was cut at 40% \([\d.]+ MiB of 12\.0 MiB written; (\d) files complete, (\d) not\)",
        out,
        re.MULTILINE,
    )
    assert m and int(m.group(2)) >= 1, out
    m2 = re.search(
        r"6/6 files verified .* resumed (\d+) \(.* not re-sent\), unchanged (\d+), failed 0$",
        out,
        re.MULTILINE,
    )
    assert m2, out
    # Complete before the cut: not sent again. A file whose last bytes reached the receiver
    # just before the cut, its confirmation lost with the connection, is complete there
    # too: the resume finds it unchanged (nothing is sent twice either way).
    assert int(m2.group(2)) >= int(m.group(1))
    assert "6/6 identical to the originals" in out
    # The first connection's unfinished files were cut on purpose: shown as cut, not FAILED.
    assert "FAILED" not in out and re.search(r"^  cut       \S+ at ", out, re.MULTILINE), out
