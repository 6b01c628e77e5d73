"""Node reference rows: the npm implementation of a format sending to itself (Node to Node,
two processes on this machine), one stream moving the bulk bytes in 64 KiB writes.

* yamux: ``@chainsafe/libp2p-yamux`` (tests/interop/node/yamux_peer.mjs, driver ``--big``
  to a responder; the peer's wire tap and the receiver's SHA-256 stay on, so these rows
  are slightly pessimistic for Node);
* mplex: ``@libp2p/mplex`` and multiplex: ``multiplex`` (mplex_peer.mjs, the same);
* mstream-v1/v2/v3: ``nerdbank-streams`` (benchmarks/node/mstream_bulk.js: counts only).

The time is taken inside the Node sender, from opening the stream to the receiver's reply.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
from pathlib import Path

from benchmarks.common import MIB, SETUP_TIMEOUT, BenchError, reap


ROOT = Path(__file__).resolve().parent.parent
PEER_DIR = ROOT / "tests" / "interop" / "node"
MSTREAM_BULK = Path(__file__).resolve().parent / "node" / "mstream_bulk.js"

_LIBP2P = {
    "yamux": ("yamux_peer.mjs", []),
    "mplex": ("mplex_peer.mjs", ["--impl", "libp2p"]),
    "multiplex": ("mplex_peer.mjs", ["--impl", "multiplex"]),
}
NODE_FORMATS = ("mstream-v1", "mstream-v2", "mstream-v3", *_LIBP2P)


def node_available() -> str | None:
    """None if Node rows can run, else why not."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (PEER_DIR / "node_modules").is_dir():
        return "tests/interop/node/node_modules is missing (scripts/setup --with-node)"
    return None


async def _lines(proc: asyncio.subprocess.Process) -> list[str]:
    assert proc.stdout is not None
    out = await proc.stdout.read()
    return out.decode(errors="replace").splitlines()


async def node_bulk(fmt: str, size: int, time_limit: float, cpus: tuple[int, int] | None = None) -> float:
    """One Node-to-Node transfer of ``size`` bytes in format ``fmt``; MiB/s. With ``cpus``
    the driver runs on the first and the listener on the second, as polymux's sender and
    receiver do."""
    timeout_ms = str(int((time_limit + SETUP_TIMEOUT) * 1000))
    if fmt.startswith("mstream-v"):
        version = fmt[-1]
        listen_cmd = ["node", str(MSTREAM_BULK), "--listen", "--version", version, "--timeout-ms", timeout_ms]
    else:
        script, extra = _LIBP2P[fmt]
        base = ["node", str(PEER_DIR / script), *extra]
        listen_cmd = [*base, "--listen", "--tcp", "0", "--mode", "responder", "--timeout-ms", timeout_ms]
    listener = await asyncio.create_subprocess_exec(
        *listen_cmd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        preexec_fn=None if cpus is None else functools.partial(os.sched_setaffinity, 0, {cpus[1]}),
    )
    driver: asyncio.subprocess.Process | None = None
    try:
        assert listener.stdout is not None
        async with asyncio.timeout(SETUP_TIMEOUT):
            first = (await listener.stdout.readline()).decode().split()
        if first[:1] != ["LISTENING"]:
            raise BenchError(f"the Node {fmt} listener did not start: {first}")
        port = first[1]
        if fmt.startswith("mstream-v"):
            drive_cmd = [
                "node", str(MSTREAM_BULK), "--connect", port, "--version", fmt[-1],
                "--size", str(size), "--timeout-ms", timeout_ms,
            ]  # fmt: skip
        else:
            drive_cmd = [
                *base, "--connect", "--tcp", port, "--mode", "driver", "--channels", "0",
                "--big", str(size), "--timeout-ms", timeout_ms,
            ]  # fmt: skip
        driver = await asyncio.create_subprocess_exec(
            *drive_cmd,
            preexec_fn=None if cpus is None else functools.partial(os.sched_setaffinity, 0, {cpus[0]}),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        async with asyncio.timeout(time_limit + SETUP_TIMEOUT):
            lines = await _lines(driver)
            await driver.wait()
        try:
            summary = json.loads(lines[-1])
        except (IndexError, ValueError):
            raise BenchError(f"the Node {fmt} driver printed no summary: {lines[-3:]}")
        if not summary.get("ok"):
            raise BenchError(f"the Node {fmt} driver failed: {str(summary)[:300]}")
        ms = summary["ms"] if fmt.startswith("mstream-v") else summary["big"]["ms"]
        return size / MIB / (max(ms, 1) / 1000)
    finally:
        await reap(driver, listener)
