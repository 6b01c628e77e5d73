"""RSS of a polymux server against time while hostile peers flood it (SECURITY.md).

Each flood of tests/hostile/test_bounds.py runs for ``--seconds`` against a server in a
process of its own; its resident memory is sampled every 20 ms and printed every
``--step`` seconds, above the baseline measured just before the flood. ``--src DIR``
runs the server from another source tree (e.g. a worktree of an older commit), so the
same floods measure before and after a change in one run::

    git worktree add /tmp/pmx-before <commit>
    .venv/bin/python benchmarks/bench_hostile.py --seconds 10 --src /tmp/pmx-before/src
    .venv/bin/python benchmarks/bench_hostile.py --seconds 10

A server whose RSS passes ``--cap`` (default 2 GiB) is stopped there (the figure is then
a lower bound).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hostile.raw import MIB, RawPeer, RssSampler, ServerProcess
from tests.hostile.test_bounds import _data_cycle, _opens, _ping_bytes


Flood = Callable[[RawPeer, float], Awaitable[int]]


async def _pings(peer: RawPeer, seconds: float) -> int:
    chunk = await _ping_bytes(peer, 64 * 1024 // 12)
    return await peer.flood(lambda: chunk, seconds)


async def _data_never_read(peer: RawPeer, seconds: float) -> int:
    handles = await peer.open_many(1024 if peer.format != "streamux" else 1000)
    return await peer.flood(_data_cycle(peer, handles, 16 * 1024), seconds)


async def _opens_flood(peer: RawPeer, seconds: float) -> int:
    burst = _opens(peer, 30_000)
    return await peer.flood(iter([burst, b""]).__next__, seconds)


async def _credit_withheld(peer: RawPeer, seconds: float) -> int:
    handles = await peer.open_many(1024)
    make = _data_cycle(peer, handles, 16 * 1024)
    sent = 0
    deadline = time.monotonic() + seconds
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(seconds):
            while time.monotonic() < deadline:
                if chunk := make():
                    await peer.send(chunk)
                    sent += len(chunk)
                if not await peer.recv():
                    break
    return sent


FLOODS: list[tuple[str, str, str, Flood]] = [
    ("ping flood, never read", "yamux", "echo", _pings),
    ("ping flood, never read", "streamux", "echo", _pings),
    ("30,000 opens, never read", "yamux", "hold", _opens_flood),
    ("30,000 opens, never read", "mstream-v3", "hold", _opens_flood),
    ("echo of 1,024 channels, never read", "mplex", "echo", _data_never_read),
    ("echo of 1,024 channels, never read", "yamux", "echo", _data_never_read),
    ("echo of 1,024 channels, never read", "mstream-v3", "echo", _data_never_read),
    ("1,024 channels never read by the app", "mplex", "hold", _data_never_read),
    ("credit withheld on 1,024 channels", "yamux", "echo", _credit_withheld),
    ("credit withheld on 1,024 channels", "mstream-v3", "echo", _credit_withheld),
]


async def run_one(
    name: str, fmt: str, mode: str, flood: Flood, args: argparse.Namespace
) -> tuple[str, list[tuple[float, int]], int, str]:
    async with ServerProcess(fmt, mode, pythonpath=args.src, quiet=True) as server:
        assert server.proc is not None
        peer = await RawPeer.connect(server.port, fmt)
        try:
            await peer.handshake()
            sampler = RssSampler(server.proc.pid)

            async def cap() -> None:
                while sampler.peak - sampler.baseline < args.cap:  # noqa: ASYNC110 - polling RSS
                    await asyncio.sleep(0.05)

            note = ""
            flooding = asyncio.ensure_future(flood(peer, args.seconds))
            capped = asyncio.ensure_future(cap())
            done, _ = await asyncio.wait({flooding, capped}, return_when=asyncio.FIRST_COMPLETED)
            if capped in done:
                note = f"stopped at the {args.cap // MIB} MiB cap"
                flooding.cancel()
            else:
                capped.cancel()
            for task in (flooding, capped):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            sent = flooding.result() if flooding.done() and not flooding.cancelled() else 0
            with contextlib.suppress(TimeoutError):
                line = await server.next_line("CLOSED", timeout=0.5)
                note = note or line.split(" ", 3)[-1][:60]
            await sampler.stop()
            return name, [(t, v - sampler.baseline) for t, v in sampler.series], sent, note
        finally:
            peer.close()


async def main(args: argparse.Namespace) -> None:
    which = "this checkout" if args.src is None else args.src
    steps = [round(i * args.step, 3) for i in range(int(args.seconds / args.step) + 1)]
    print(f"# RSS growth of the server above its baseline (MiB), {which}, {args.seconds:g} s per flood\n")
    print("| flood | format | " + " | ".join(f"{t:g} s" for t in steps) + " | peak | sent MiB | note |")
    print("|---|---|" + "---|" * len(steps) + "---|---|---|")
    for name, fmt, mode, flood in FLOODS:
        if args.formats and fmt not in args.formats:
            continue
        _name, series, sent, note = await run_one(name, fmt, mode, flood, args)
        cells = []
        for t in steps:
            values = [v for s, v in series if s <= t]
            cells.append(f"{(values[-1] if values else 0) / MIB:.1f}")
        peak = max((v for _s, v in series), default=0)
        print(
            f"| {name} | {fmt} | " + " | ".join(cells) + f" | {peak / MIB:.1f} | {sent / MIB:.1f} | {note} |",
            flush=True,
        )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="flood duration (default 10)")
    parser.add_argument("--step", type=float, default=1.0, help="print RSS every STEP seconds (default 1)")
    parser.add_argument("--src", help="run the server from this source tree (PYTHONPATH)")
    parser.add_argument("--cap", type=int, default=2048, help="stop a flood past this RSS growth, MiB")
    parser.add_argument("--formats", type=lambda s: s.split(","), default=None)
    args = parser.parse_args()
    args.cap *= MIB
    if args.src is not None:
        args.src = os.path.abspath(args.src)
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
