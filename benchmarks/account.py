"""Where the receiver's CPU goes, per data frame: ``python -m benchmarks.account``.

Bulk on one channel (``--channels``: more), sender and receiver in processes of their own, each pinned to a CPU
(the suite's set-up: :mod:`benchmarks.peer`). For each row (``raw-protocol``: uvloop's
socket reads and the kernel, nothing else; ``raw-streams``; then each format) the receiving
process reports its user and system CPU seconds (``getrusage``) before and after every
transfer, and this process its own, the sender's. Rows are interleaved, every figure is
the median of ``--repeat`` transfers, all in one run.

Per data frame of the format (its sender's ``max_frame``), the receiver's CPU is split:

* **kernel**: system time (raw-protocol's for the same bytes is the socket's own share);
* **loop + socket** in user space: raw-protocol's user time for the same bytes (uvloop's
  reads and callbacks, which every receiver pays);
* **polymux**: the rest of the user time, split by layer with ``--profile`` (the
  receiver's cProfile over the format's transfers, CPU time; cProfile slows Python, so its
  shares are applied to the unprofiled figure): the codec (``wire/``), the engine
  (``engine/``), the session core (``session/``), the asyncio driver (``aio/``), the stdlib
  ``StreamReader`` and built-ins (the copies), and the application's reads.

The **bound** is the side whose CPU share is near 100 % (at least 90 %) during the
transfer: a receiver at 100 % of its core delivers ``1 / (CPU per MiB)`` and no faster;
the sender's CPU per frame is printed next to raw-protocol's for the same bytes. ::

    .venv/bin/python -m benchmarks.account                               # mplex, yamux, mstream-v3, smux
    .venv/bin/python -m benchmarks.account --formats yamux --profile --repeat 7
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
from collections import defaultdict
from typing import Any

import polymux
from benchmarks import scenarios as sc
from benchmarks.common import MIB, RAW_PROTOCOL, RAW_STREAMS, close_session, cpu_pair, loop_factory, pin
from benchmarks.peer import Peer
from polymux.apps.common import size_type


LAYERS = (
    ("codec (wire/)", ("/polymux/wire/",)),
    ("engine (engine/)", ("/polymux/engine/",)),
    ("session core (session/)", ("/polymux/session/",)),
    ("asyncio driver (aio/)", ("/polymux/aio/",)),
    ("StreamReader (stdlib)", ("asyncio/streams.py",)),
    ("application reads (benchmarks/)", ("/benchmarks/",)),
)
"""cProfile entries by where their code lives (first match); the rest: built-ins (copies,
joins, the loop's C callbacks that Python sees) and other stdlib."""


def _short(path: str) -> str:
    """A profile entry's file, short: ``polymux/aio/session.py``, ``streams.py``, ``~``."""
    for root in ("/polymux/", "/benchmarks/"):
        if root in path:
            return root.strip("/") + "/" + path.split(root, 1)[1]
    return path.rsplit("/", 1)[-1]


def layer_of(filename: str) -> str:
    """The layer a cProfile entry belongs to (see :data:`LAYERS`)."""
    for name, marks in LAYERS:
        if any(mark in filename for mark in marks):
            return name
    return "built-ins (copies) and other" if filename == "~" else "other stdlib"


async def _frame_size(peer: Peer, fmt: str, options: dict[str, Any]) -> int:
    """The largest data frame the format's sender makes on this session (its max_frame)."""
    session = await peer.endpoints[fmt].connect(fmt, **options)
    try:
        return max(1, int(session.engine.max_frame))
    finally:
        await close_session(session)


async def _one(
    peer: Peer, row: str, payload: memoryview, channels: int = 1, options: dict[str, Any] | None = None
) -> dict[str, float]:
    """One transfer of ``payload`` over ``channels`` channels (raw rows: connections):
    elapsed seconds and both sides' CPU seconds."""
    ep = peer.endpoints[row]
    user0, sys0 = await peer.ask("cpu")
    mine0 = resource.getrusage(resource.RUSAGE_SELF)
    if row == RAW_PROTOCOL:
        rate = await sc.bulk_raw_protocol(ep, payload, channels)
    elif row == RAW_STREAMS:
        rate = await sc.bulk_raw_streams(ep, payload, channels)
    else:
        rate = await sc.bulk_polymux(ep, row, payload, channels, options)
    mine1 = resource.getrusage(resource.RUSAGE_SELF)
    user1, sys1 = await peer.ask("cpu")
    return {
        "elapsed": len(payload) / MIB / rate,
        "user": user1 - user0,
        "sys": sys1 - sys0,
        "sender": (mine1.ru_utime - mine0.ru_utime) + (mine1.ru_stime - mine0.ru_stime),
    }


async def run(args: argparse.Namespace) -> int:
    """Measure every row, then print the accounting (and the profile split)."""
    formats = [f for f in args.formats.split(",") if f]
    pair = cpu_pair() if args.pin else None
    pin(pair[0] if pair else None)
    peer = Peer(args.loop, args.transport, formats, cpu=pair[1] if pair else None).start()
    try:
        payload = memoryview(bytes(args.mib * MIB))
        rows = [RAW_PROTOCOL, RAW_STREAMS, *formats]
        frame = {fmt: await _frame_size(peer, fmt, args.options) for fmt in formats}
        for row in rows:  # warm-up: connections, first allocations
            await _one(peer, row, payload[: 8 * MIB])
        runs: dict[str, list[dict[str, float]]] = defaultdict(list)
        for _ in range(args.repeat):
            for row in rows:
                runs[row].append(await _one(peer, row, payload, args.channels, args.options))
        med = {row: {k: statistics.median(r[k] for r in runs[row]) for k in runs[row][0]} for row in rows}
        layers: dict[str, dict[str, float]] = {}
        tops: dict[str, list[tuple[str, int, float]]] = {}
        if args.profile:
            for fmt in formats:
                await peer.ask("cprofile_on")
                for _ in range(max(1, args.repeat // 2)):
                    await _one(peer, fmt, payload, args.channels, args.options)
                entries: list[tuple[str, int, str, int, float]] = await peer.ask("cprofile_entries")
                split: dict[str, float] = defaultdict(float)
                for filename, _line, _func, _calls, own in entries:
                    split[layer_of(filename)] += own
                layers[fmt] = dict(split)
                total = sum(split.values()) or 1.0
                ranked = sorted(entries, key=lambda e: -e[4])[: args.top]
                tops[fmt] = [
                    (f"{func} ({_short(path)}:{line})", calls, own / total)
                    for path, line, func, calls, own in ranked
                ]
    finally:
        peer.stop()
    report(args, med, frame, layers, tops)
    return 0


def report(
    args: argparse.Namespace,
    med: dict[str, dict[str, float]],
    frame: dict[str, int],
    layers: dict[str, dict[str, float]],
    tops: dict[str, list[tuple[str, int, float]]],
) -> None:
    """Print the tables: per row, then per frame, then the profile split."""
    mib = args.mib
    raw = med[RAW_PROTOCOL]
    print(
        f"\n## Bulk, {args.channels} channel(s), {mib} MiB, {args.loop}/{args.transport}, "
        f"{'pinned' if args.pin else 'not pinned'}; medians of {args.repeat}\n"
    )
    print(
        "| row | MiB/s | x raw-protocol | x raw-streams | receiver CPU % | sender CPU % | receiver us/MiB user + sys |"
    )
    print("|---|---|---|---|---|---|---|")
    for row, m in med.items():
        rate = mib / m["elapsed"]
        print(
            f"| {row} | {rate:,.0f} | {raw['elapsed'] / m['elapsed']:.2f} | "
            f"{med[RAW_STREAMS]['elapsed'] / m['elapsed']:.2f} | "
            f"{100 * (m['user'] + m['sys']) / m['elapsed']:.0f} | {100 * m['sender'] / m['elapsed']:.0f} | "
            f"{1e6 * m['user'] / mib:,.0f} + {1e6 * m['sys'] / mib:,.0f} |"
        )
    print("\n## The receiver's CPU per data frame (us)\n")
    print(
        "| format | frame | frames | total | kernel (raw-protocol's) | loop + socket, user "
        "(raw-protocol's) | polymux's Python | 0.9 x raw-protocol needs a total of | sender's CPU "
        "(raw-protocol's) | bound |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for fmt, size in frame.items():
        m = med[fmt]
        frames = -(-mib * MIB // size)
        per = 1e6 / frames
        raw_user, raw_sys = raw["user"] * per, raw["sys"] * per
        user, system = m["user"] * per, m["sys"] * per
        # At 100 % of its core, the receiver's rate is 1 / CPU per byte: 0.9 x raw's rate
        # (raw's own elapsed time) allows this much CPU per frame.
        allowed = 1e6 * raw["elapsed"] / 0.9 / frames
        # A side at (nearly) 100 % of its core during the transfer is what bounds it.
        busy = [
            side
            for side, cpu in (("receiver", m["user"] + m["sys"]), ("sender", m["sender"]))
            if cpu >= 0.9 * m["elapsed"]
        ]
        print(
            f"| {fmt} | {size // 1024} KiB | {frames:,} | {user + system:.1f} | {system:.1f} ({raw_sys:.1f}) | "
            f"{raw_user:.1f} | {user - raw_user:.1f} | {allowed:.1f} | {m['sender'] * per:.1f} "
            f"({raw['sender'] * per:.1f}) | {' and '.join(busy) or 'neither (waits)'} |"
        )
    for fmt, split in layers.items():
        m = med[fmt]
        frames = -(-mib * MIB // frame[fmt])
        excess = (m["user"] - raw["user"]) * 1e6 / frames
        total = sum(split.values()) or 1.0
        print(f"\n## {fmt}: polymux's Python per frame by layer ({excess:.1f} us, cProfile shares)\n")
        print("| layer | share | us per frame |\n|---|---|---|")
        for name, own in sorted(split.items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {100 * own / total:.0f} % | {excess * own / total:.1f} |")
        print(
            f"\n| function (top {args.top} by own time) | calls per frame | share | us per frame |\n|---|---|---|---|"
        )
        profiled_frames = frames * max(1, args.repeat // 2)
        for name, calls, share in tops[fmt]:
            print(
                f"| `{name}` | {calls / profiled_frames:.2f} | {100 * share:.1f} % | {excess * share:.2f} |"
            )
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.account", description=__doc__.splitlines()[0])
    p.add_argument("--formats", default="mplex,yamux,mstream-v3,smux", help="comma-separated")
    p.add_argument("--loop", default="uvloop", choices=["asyncio", "uvloop"])
    p.add_argument("--transport", default="tcp", choices=["tcp", "unix"])
    p.add_argument("--mib", type=int, default=256, help="MiB per transfer")
    p.add_argument("--channels", type=int, default=1, help="channels per transfer (raw rows: connections)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--profile", action="store_true", help="split polymux's Python by layer (cProfile)")
    p.add_argument("--top", type=int, default=15, help="functions listed per format with --profile")
    p.add_argument(
        "--send-frame",
        type=size_type(1024),
        default=None,
        metavar="SIZE",
        help="the sender's send_frame (default: polymux's)",
    )
    p.add_argument(
        "--batch",
        type=size_type(1024),
        default=None,
        metavar="SIZE",
        help="the sender's batch_bytes (default: polymux's)",
    )
    p.add_argument("--no-pin", dest="pin", action="store_false", help="do not pin the two processes")
    args = p.parse_args(argv)
    args.options = {} if args.send_frame is None else {"send_frame": args.send_frame}
    if args.batch is not None:
        args.options["batch_bytes"] = args.batch
    unknown = [f for f in args.formats.split(",") if f and f not in polymux.PROTOCOLS]
    if unknown:
        p.error(f"unknown formats: {', '.join(unknown)} (known: {', '.join(polymux.PROTOCOLS)})")
    with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
        return runner.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
