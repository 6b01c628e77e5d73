"""Bridged bulk throughput as a ratio of a direct session, in the same run (quick).

Three processes: a receiving process serving polymux (one server per format; each channel
starts with its expected length in 8 bytes, the receiver reads to the end and answers one
byte), ``polymux bridge`` as a user runs it (``--quiet``), and this process, which sends.
For each pair ``A>B``, interleaved (A/B/A/B), one fresh session per measurement:

* ``direct A``: A to the receiver's A server;
* ``direct B``: B to the receiver's B server (what the clients speak once migrated);
* ``bridged``: A to the bridge, which carries it as B to the receiver's B server.

SIZE bytes in all per measurement, on 1 channel and on 16 in parallel (SIZE/16 each),
64 KiB writes with ``drain()``; the clock runs from the first write until the last
answer. The median of ``--repeat`` runs is shown, with the ratio bridged / direct B.

    .venv/bin/python benchmarks/bench_bridge.py [--mib 32] [--repeat 3] [--pairs mplex>yamux,mstream-v3>yamux] [--uvloop]

``--uvloop`` runs all three processes on uvloop (the bridge with ``polymux bridge --uvloop``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import polymux


T = TypeVar("T")


MIB = 1 << 20
WRITE = 64 * 1024
CHANNELS = (1, 16)
LIMIT = 120.0
"""Seconds one measurement may take."""
ROOT = Path(__file__).resolve().parents[1]


# -- the receiving process -----------------------------------------------------------------


async def _count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    expected = int.from_bytes(await reader.readexactly(8), "big")
    n = 0
    while data := await reader.read(256 * 1024):
        n += len(data)
    writer.write(b"\x01" if n == expected else b"\x00")
    writer.close()


async def _receive(protocols: list[str]) -> None:
    servers = [await polymux.start_server(_count, "127.0.0.1", 0, protocol=p) for p in protocols]
    print("PORTS " + ",".join(f"{p}={s.port}" for p, s in zip(protocols, servers, strict=True)), flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    await stdin.read()  # until the parent closes our stdin
    for server in servers:
        server.close()


# -- the sending side ----------------------------------------------------------------------


async def _send(protocol: str, port: int, payload: memoryview, channels: int) -> float:
    """One measurement: seconds from the first write to the last answer."""
    part = len(payload) // channels
    session = await polymux.connect("127.0.0.1", port, protocol=protocol)
    try:
        pairs = [await session.open_channel(f"bulk/{i}") for i in range(channels)]

        async def one(i: int) -> None:
            reader, writer = pairs[i]
            writer.write(part.to_bytes(8, "big"))
            view = payload[i * part : (i + 1) * part]
            for off in range(0, part, WRITE):
                writer.write(view[off : off + WRITE])
                await writer.drain()
            writer.write_eof()
            if await reader.read(1) != b"\x01":
                raise RuntimeError(f"{protocol}: the receiver counted another size")

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(channels)))
        return time.perf_counter() - start
    finally:
        await session.aclose()


def _run(coro: Coroutine[Any, Any, T], use_uvloop: bool) -> T:
    if use_uvloop:
        import uvloop

        result: T = uvloop.run(coro)
        return result
    return asyncio.run(coro)


async def _start_receiver(
    protocols: list[str], loop: list[str]
) -> tuple[asyncio.subprocess.Process, dict[str, int]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__)), "--receiver", ",".join(protocols), *loop,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()
    if line[:1] != ["PORTS"]:
        raise RuntimeError(f"the receiver did not start: {line}")
    ports = {name: int(port) for name, port in (item.split("=") for item in line[1].split(","))}
    return proc, ports


async def _start_bridge(
    near: str, far: str, port: int, loop: list[str]
) -> tuple[asyncio.subprocess.Process, int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "polymux", "bridge", "--quiet", *loop,
        f"{near}:tcp:127.0.0.1:0", f"{far}:tcp:127.0.0.1:{port}",
        stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    first = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    if not first.startswith("polymux bridge: "):
        raise RuntimeError(f"the bridge did not start: {first!r}")
    listening = first.split(" on ")[1].split()[0]  # tcp:127.0.0.1:PORT
    return proc, int(listening.rpartition(":")[2])


async def measure(
    pairs: list[tuple[str, str]], size: int, repeat: int, use_uvloop: bool = False
) -> list[dict[str, object]]:
    """Every row's runs, interleaved; returns one dict per (pair, channels)."""
    protocols = sorted({p for pair in pairs for p in pair})
    loop = ["--uvloop"] if use_uvloop else []
    receiver, ports = await _start_receiver(protocols, loop)
    bridges: dict[tuple[str, str], tuple[asyncio.subprocess.Process, int]] = {}
    payload = memoryview(bytes(size))
    runs: dict[tuple[str, str, int, str], list[float]] = {}
    try:
        for near, far in pairs:
            bridges[(near, far)] = await _start_bridge(near, far, ports[far], loop)
        for _ in range(repeat):
            for near, far in pairs:
                for channels in CHANNELS:
                    cases = [
                        ("direct A", near, ports[near]),
                        ("direct B", far, ports[far]),
                        ("bridged", near, bridges[(near, far)][1]),
                    ]
                    for case, protocol, port in cases:
                        async with asyncio.timeout(LIMIT):
                            elapsed = await _send(protocol, port, payload, channels)
                        runs.setdefault((near, far, channels, case), []).append(elapsed)
    finally:
        for proc, _port in bridges.values():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            await proc.wait()
        if receiver.stdin is not None:
            receiver.stdin.close()
        try:
            await asyncio.wait_for(receiver.wait(), 10)
        except TimeoutError:
            receiver.kill()
            await receiver.wait()
    rows: list[dict[str, object]] = []
    for near, far in pairs:
        for channels in CHANNELS:
            rate = {
                case: size / MIB / statistics.median(runs[(near, far, channels, case)])
                for case in ("direct A", "direct B", "bridged")
            }
            rows.append(
                {
                    "pair": f"{near}>{far}",
                    "channels": channels,
                    "direct_a_mib_s": round(rate["direct A"], 1),
                    "direct_b_mib_s": round(rate["direct B"], 1),
                    "bridged_mib_s": round(rate["bridged"], 1),
                    "ratio": round(rate["bridged"] / rate["direct B"], 2),
                }
            )
    return rows


def report(rows: list[dict[str, object]], size: int, repeat: int, loop: str) -> None:
    print(
        f"polymux {polymux.__version__}, Python {platform.python_version()}, {platform.machine()}, {loop}; "
        f"{size // MIB} MiB per measurement, median of {repeat}"
    )
    print("| pair A>B | channels | direct A | direct B | bridged A>B | bridged / direct B |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['pair']} | {r['channels']} | {r['direct_a_mib_s']} MiB/s | {r['direct_b_mib_s']} MiB/s | "
            f"{r['bridged_mib_s']} MiB/s | {r['ratio']}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=32, help="MiB moved per measurement (default 32)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the median counts (default 3)")
    parser.add_argument(
        "--pairs",
        default="mplex>yamux,mstream-v3>yamux",
        help="bridged pairs NEAR>FAR, comma-separated (default mplex>yamux,mstream-v3>yamux)",
    )
    parser.add_argument("--uvloop", action="store_true", help="run all three processes on uvloop")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    parser.add_argument("--receiver", metavar="FORMATS", help=argparse.SUPPRESS)  # the receiving process
    args = parser.parse_args()
    if args.receiver:
        _run(_receive(args.receiver.split(",")), args.uvloop)
        return
    pairs = []
    for item in args.pairs.split(","):
        near, sep, far = item.partition(">")
        if not sep or near not in polymux.PROTOCOLS or far not in polymux.PROTOCOLS:
            parser.error(f"--pairs: not a pair of formats NEAR>FAR: {item!r}")
        pairs.append((near, far))
    if args.mib <= 0 or args.repeat <= 0:
        parser.error("--mib and --repeat must be positive")
    size = args.mib * MIB - (args.mib * MIB) % (max(CHANNELS) * WRITE)
    rows = _run(measure(pairs, size, args.repeat, args.uvloop), args.uvloop)
    if args.json:
        print(json.dumps(rows))
    else:
        report(rows, size, args.repeat, "uvloop" if args.uvloop else "asyncio")


if __name__ == "__main__":
    main()
