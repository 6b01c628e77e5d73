"""Go reference rows: the Go library that deployed systems use for a format, sending to
itself (Go to Go, two processes on this machine), so the report shows polymux / Go for the
same format.

* yamux: hashicorp/yamux (Debian ``golang-github-hashicorp-yamux-dev``, snapshot df201c7,
  library defaults: 256 KiB windows, accept backlog 256), through the interop peer
  ``tests/interop/go/yamux_peer`` (``--mode bench`` into a ``--mode responder --no-tap``).
* smux, smux-v2: xtaci/smux (Debian ``golang-github-xtaci-smux-dev`` 1.5.16, library
  defaults but the protocol version: 32 KiB frames, 4 MiB session receive buffer, in version
  2 64 KiB stream windows), through ``tests/interop/go/smux_peer`` (the same modes, with
  ``--version 1`` or ``2`` on both sides).

The same bulk shape as polymux's rows: N streams of one session move SIZE bytes in all
(SIZE/N each) in 64 KiB writes; the receiver counts and answers one byte per stream. The
streams are opened first; the time runs inside the Go sender from the first write to the
last answer. The peers are built by ``tests/interop/gobuild.py`` (``scripts/setup
--with-system`` installs the Go toolchain and libraries from Debian).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

from benchmarks.common import SETUP_TIMEOUT, BenchError, reap


ROOT = Path(__file__).resolve().parent.parent

GO_PEERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "yamux": ("yamux_peer", ()),
    "smux": ("smux_peer", ("--version", "1")),
    "smux-v2": ("smux_peer", ("--version", "2")),
}
"""Formats with a Go reference row: the Go peer that drives the library, and its options."""
GO_FORMATS = tuple(GO_PEERS)


GOBUILD = ROOT / "tests" / "interop" / "gobuild.py"


def _gobuild() -> ModuleType:
    """The tests' Go builder, loaded from its file (the tests are not a package on sys.path)."""
    name = "_polymux_bench_gobuild"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, GOBUILD)
        assert spec is not None and spec.loader is not None, GOBUILD
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def _peer(fmt: str) -> Path:
    path: Path = _gobuild().build(GO_PEERS[fmt][0])
    return path


def go_available() -> str | None:
    """None if the Go rows can run, else why not."""
    if not GOBUILD.is_file():
        return f"{GOBUILD} is missing"
    try:
        for fmt in GO_FORMATS:
            _peer(fmt)
    except _gobuild().GoUnavailable as exc:
        return str(exc)
    return None


async def go_bulk(
    fmt: str, size: int, channels: int, time_limit: float, cpus: tuple[int, int] | None = None
) -> float:
    """One Go-to-Go transfer of ``size`` bytes over ``channels`` streams in format ``fmt``;
    MiB/s. With ``cpus`` the sender runs on the first and the receiver on the second, as
    polymux's sender and receiver do."""
    binary = str(_peer(fmt))
    options = GO_PEERS[fmt][1]
    timeout_ms = str(int((time_limit + SETUP_TIMEOUT) * 1000))
    listener = await asyncio.create_subprocess_exec(
        binary, "--listen", "--tcp", "0", "--mode", "responder", "--no-tap", *options, "--timeout-ms", timeout_ms,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        preexec_fn=None if cpus is None else functools.partial(os.sched_setaffinity, 0, {cpus[1]}),
    )  # fmt: skip
    driver: asyncio.subprocess.Process | None = None
    try:
        assert listener.stdout is not None
        async with asyncio.timeout(SETUP_TIMEOUT):
            first = (await listener.stdout.readline()).decode().split()
        if first[:1] != ["LISTENING"]:
            raise BenchError(f"the Go {fmt} listener did not start: {first}")
        driver = await asyncio.create_subprocess_exec(
            binary, "--connect", "--tcp", first[1], "--mode", "bench", *options,
            "--channels", str(channels), "--size", str(size // channels), "--timeout-ms", timeout_ms,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            preexec_fn=None if cpus is None else functools.partial(os.sched_setaffinity, 0, {cpus[0]}),
        )  # fmt: skip
        async with asyncio.timeout(time_limit + SETUP_TIMEOUT):
            out, _ = await driver.communicate()
        lines = out.decode(errors="replace").splitlines()
        try:
            summary = json.loads(lines[-1])
        except (IndexError, ValueError):
            raise BenchError(f"the Go {fmt} sender printed no summary: {lines[-3:]}")
        if not summary.get("ok"):
            raise BenchError(f"the Go {fmt} sender failed: {str(summary)[:300]}")
        return float(summary["mib_per_s"])
    finally:
        await reap(driver, listener)
