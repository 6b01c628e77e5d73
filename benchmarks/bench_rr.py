"""Request/response benchmark: small-message rate and 1 MiB responses, against raw TCP.

For each event loop and protocol, in the same run:

* raw-tcp: ``--concurrency`` connections, each doing request/response in a loop: a 4-byte
  length prefix and the request, answered the same way (the usual length-prefixed RPC);
* polymux: one session, ``--concurrency`` tasks each doing ``await session.request(body)``
  in a loop (one channel per request: open, write, half-close, read the answer), which
  is Streamux's native shape and works on every format.

Two scenarios: 64-byte requests with 64-byte answers (requests per second), and 16-byte
requests with 1 MiB answers (MiB/s). Each figure is the best of ``--repeat`` runs, shown
with its ratio to raw TCP measured in the same loop run.

    .venv/bin/python benchmarks/bench_rr.py [--protocols streamux,yamux] [--loops uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import sys
import time
from collections.abc import Awaitable, Callable

import polymux


MIB = 1 << 20
LOOPS = ("asyncio", "uvloop")
SCENARIOS = {"small": (64, 64), "bulk": (16, MIB)}
"""name: (request bytes, answer bytes)"""


def _loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop  # type: ignore[no-any-return]
    return asyncio.new_event_loop


async def _run_for(
    workers: int, duration: float, one: Callable[[int], Awaitable[int]]
) -> tuple[int, int, float]:
    """Run ``one(worker)`` in a loop on ``workers`` tasks for ``duration`` seconds; return
    (requests, answer bytes, seconds)."""
    stop = time.perf_counter() + duration
    counts = [0] * workers
    sizes = [0] * workers

    async def worker(i: int) -> None:
        while time.perf_counter() < stop:
            sizes[i] += await one(i)
            counts[i] += 1

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(workers))), duration + 60)
    return sum(counts), sum(sizes), time.perf_counter() - start


async def raw_rr(request: int, answer: int, workers: int, duration: float) -> tuple[int, int, float]:
    body = bytes(answer)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                n = int.from_bytes(await reader.readexactly(4), "big")
                await reader.readexactly(n)
                writer.write(len(body).to_bytes(4, "big"))
                writer.write(body)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pairs = [await asyncio.open_connection("127.0.0.1", port) for _ in range(workers)]
    req = request.to_bytes(4, "big") + bytes(request)

    async def one(i: int) -> int:
        reader, writer = pairs[i]
        writer.write(req)
        n = int.from_bytes(await reader.readexactly(4), "big")
        return len(await reader.readexactly(n))

    try:
        return await _run_for(workers, duration, one)
    finally:
        for _r, w in pairs:
            w.close()
        server.close()


async def polymux_rr(
    protocol: str, request: int, answer: int, workers: int, duration: float
) -> tuple[int, int, float]:
    body = bytes(answer)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.write(body)
        writer.write_eof()
        writer.close()

    async with (
        # (inbound_channel_rate: one channel per request is the point here, not an abuse;
        # past 10,000 requests per second the default limit ends the session.)
        await polymux.start_server(
            serve, "127.0.0.1", 0, protocol=protocol, inbound_channel_rate=1e9
        ) as server,
        await polymux.connect("127.0.0.1", server.port, protocol=protocol) as session,
    ):
        req = bytes(request)

        async def one(_i: int) -> int:
            return len(await session.request(req))

        return await _run_for(workers, duration, one)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocols", default="streamux,yamux,mplex,mstream-v3")
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    protocols = [p for p in args.protocols.split(",") if p]
    for p in protocols:
        if p not in polymux.PROTOCOLS:
            parser.error(f"unknown protocol {p!r}")
    print(
        f"bench_rr: python {platform.python_version()}, polymux {polymux.__version__}, "
        f"{args.concurrency} concurrent requesters, {args.seconds:g} s per run, best of {args.repeat}"
    )
    header = f"{'loop':<8} {'scenario':<8} {'transport':<11} {'req/s':>9} {'MiB/s':>8} {'vs raw':>7}"
    for loop_name in [x for x in args.loops.split(",") if x]:
        results: dict[tuple[str, str], tuple[float, float]] = {}

        async def run_all(results: dict[tuple[str, str], tuple[float, float]] = results) -> None:
            for scenario, (req, ans) in SCENARIOS.items():
                for transport in ("raw-tcp", *protocols):
                    best = (0.0, 0.0)
                    for _ in range(args.repeat):
                        if transport == "raw-tcp":
                            n, size, secs = await raw_rr(req, ans, args.concurrency, args.seconds)
                        else:
                            n, size, secs = await polymux_rr(
                                transport, req, ans, args.concurrency, args.seconds
                            )
                        if n / secs > best[0]:
                            best = (n / secs, size / MIB / secs)
                    results[(scenario, transport)] = best

        with asyncio.Runner(loop_factory=_loop_factory(loop_name)) as runner:
            runner.run(run_all())
        print(f"\n{header}\n{'-' * len(header)}")
        for (scenario, transport), (rate, mibs) in results.items():
            base = results[(scenario, "raw-tcp")][0]
            print(
                f"{loop_name:<8} {scenario:<8} {transport:<11} {rate:>9.0f} {mibs:>8.1f} {rate / base:>6.2f}x"
            )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
