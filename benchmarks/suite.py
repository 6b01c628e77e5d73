"""``python -m benchmarks``: the whole suite in one command.

For each event loop and transport (TCP on 127.0.0.1, unix socket) a receiving process is
started (:mod:`benchmarks.peer`); this process sends. Every scenario measures polymux
and its baselines in the same run, interleaved, and the reports give polymux / baseline.
Writes results.md, results.json and PNG plots to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polymux
from benchmarks import report, scenarios as sc
from benchmarks.common import (
    LOOPS,
    MIB,
    RAW_STREAMS,
    TRANSPORTS,
    Job,
    Row,
    cpu_pair,
    interleave,
    loop_factory,
    pin,
)
from benchmarks.go_ref import GO_FORMATS, go_available, go_bulk
from benchmarks.node_ref import NODE_FORMATS, node_available, node_bulk
from benchmarks.peer import Peer
from polymux.apps.common import size_type


SCENARIOS = ("bulk", "messages", "rr", "churn", "scale", "slow", "tracing", "soak")
DEFAULT_SCENARIOS = SCENARIOS[:-1]
"""What runs without ``--scenarios``: all but the soak, which runs for minutes."""
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Budget:
    """Sizes of one mode."""

    repeat: int
    bulk_mib: float
    bulk_channels: tuple[int, ...]
    message_sizes: tuple[int, ...]
    messages: int
    rr_channels: tuple[int, ...]
    seconds: float
    scale_counts: tuple[int, ...]
    slow_mib: float
    slow_delay_us: int
    time_limit: float


QUICK = Budget(2, 16, (1, 16, 256), (64, 1024), 3000, (1, 64), 0.15, (1000,), 4, 2000, 120)
FULL = Budget(3, 512, (1, 16, 256), (64, 1024), 100_000, (1, 64), 2.0, (10_000, 100_000), 64, 2000, 600)


def _list(value: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"unknown {what} {bad or value!r}; choose from {', '.join(allowed)}")
    return items


def _ints(value: str) -> list[int]:
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}")
    if not items or min(items) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {value!r}")
    return items


def build_parser() -> argparse.ArgumentParser:
    """The suite's command line (also used by ``polymux bench``)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the suite's options to ``p``."""
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CI-sized run (the default)")
    mode.add_argument(
        "--full", action="store_true", help="the issue's sizes: 512 MiB bulk, 100k channels ..."
    )
    p.add_argument(
        "--formats",
        type=lambda v: _list(v, polymux.PROTOCOLS, "format"),
        default=list(polymux.PROTOCOLS),
        help=f"comma-separated (default all: {','.join(polymux.PROTOCOLS)})",
    )
    p.add_argument(
        "--scenarios",
        type=lambda v: _list(v, SCENARIOS, "scenario"),
        default=list(DEFAULT_SCENARIOS),
        help=f"comma-separated (default all but soak: {','.join(DEFAULT_SCENARIOS)}); soak: clients of "
        "every format through a fault proxy for --minutes, failing when the server's memory, file "
        "descriptors, tasks or sessions grow",
    )
    p.add_argument(
        "--minutes", type=float, default=5.0, help="how long the soak runs (default 5; the issue's run: 30)"
    )
    p.add_argument("--seed", type=int, default=1, help="the soak's seed (faults and sizes; default 1)")
    p.add_argument("--loops", type=lambda v: _list(v, LOOPS, "loop"), default=list(LOOPS))
    p.add_argument("--transports", type=lambda v: _list(v, TRANSPORTS, "transport"), default=list(TRANSPORTS))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--repeat", type=int, help="repeats per figure (quick 2, full 3)")
    p.add_argument(
        "--bulk-size",
        type=size_type(MIB),
        metavar="SIZE",
        help="bytes moved per bulk measurement, e.g. 64MiB (quick 16MiB, full 512MiB)",
    )
    p.add_argument("--bulk-mib", type=float, help=argparse.SUPPRESS)  # the old spelling, in MiB
    p.add_argument("--bulk-channels", type=_ints, help="bulk channel counts (default 1,16,256)")
    p.add_argument("--messages", type=int, help="messages per small-message measurement (quick 3000)")
    p.add_argument("--seconds", type=float, help="seconds per rr / churn measurement (quick 0.15, full 2)")
    p.add_argument("--scale-counts", type=_ints, help="idle channel counts (quick 1000, full 10000,100000)")
    p.add_argument(
        "--slow-size",
        type=size_type(MIB),
        metavar="SIZE",
        help="bytes sent into the slow reader, e.g. 8MiB (quick 4MiB, full 64MiB)",
    )
    p.add_argument("--slow-mib", type=float, help=argparse.SUPPRESS)  # the old spelling, in MiB
    p.add_argument("--no-node", action="store_true", help="no Node reference rows even if node is present")
    p.add_argument("--no-go", action="store_true", help="no Go reference rows even if Go is present")
    p.add_argument(
        "--no-pin",
        action="store_true",
        help="leave the sending and receiving processes where the scheduler puts them "
        "(default: each pinned to a CPU of its own)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")


def budget_from(args: argparse.Namespace) -> Budget:
    """The mode's budget with the command line's overrides."""
    b = FULL if args.full else QUICK
    return Budget(
        repeat=args.repeat or b.repeat,
        bulk_mib=args.bulk_size / MIB if args.bulk_size else args.bulk_mib or b.bulk_mib,
        bulk_channels=tuple(args.bulk_channels or b.bulk_channels),
        message_sizes=b.message_sizes,
        messages=args.messages or b.messages,
        rr_channels=b.rr_channels,
        seconds=args.seconds or b.seconds,
        scale_counts=tuple(args.scale_counts or b.scale_counts),
        slow_mib=args.slow_size / MIB if args.slow_size else args.slow_mib or b.slow_mib,
        slow_delay_us=b.slow_delay_us,
        time_limit=b.time_limit,
    )


def tracing_available() -> bool:
    """True once polymux.tracing with CaptureRecorder exists."""
    try:
        from polymux.tracing import CaptureRecorder  # type: ignore[import-not-found,unused-ignore] # noqa: F401
    except ImportError:
        return False
    return True


async def run_combo(
    peer: Peer, loop: str, transport: str, args: argparse.Namespace, b: Budget, tmp: str
) -> list[Row]:
    """Every selected scenario on one event loop and transport."""
    progress = not args.quiet
    fmts: list[str] = args.formats
    rows: list[Row] = []
    jobs: list[Job] = []
    want = set(args.scenarios)
    if "bulk" in want or "tracing" in want:
        size = max(256, int(b.bulk_mib * MIB) // 256 * 256)
        payload = memoryview(bytes(range(256)) * (size // 256))
        capture = None
        if "tracing" in want and tracing_available():
            capture = os.path.join(tmp, f"capture-{loop}-{transport}")
            os.makedirs(capture, exist_ok=True)
        bulk = sc.bulk_jobs(peer, loop, transport, fmts, list(b.bulk_channels), payload, capture)
        if "bulk" not in want:
            bulk = [j for j in bulk if j.row.scenario == "tracing"]
        jobs += bulk
        node_loop = "uvloop" if "uvloop" in args.loops else args.loops[-1]
        if (
            "bulk" in want
            and transport == "tcp"
            and loop == node_loop
            and not args.no_node
            and node_available() is None
        ):
            # Node's speed does not depend on our event loop: measured once, interleaved with
            # the uvloop rows (the loop of the targets).
            for fmt in fmts:
                if fmt in NODE_FORMATS:
                    r = Row(
                        "bulk",
                        "1 ch",
                        fmt + report.NODE_SUFFIX,
                        loop,
                        transport,
                        "MiB/s",
                        baseline=RAW_STREAMS,
                        extra={"channels": 1, "note": "Node to Node, npm reference package"},
                        x=1,
                    )
                    jobs.append(Job(r, lambda fmt=fmt: node_bulk(fmt, len(payload), b.time_limit, args.cpus)))
        if "bulk" in want and transport == "tcp" and loop == node_loop and args.go_rows:
            # The Go library of the format, Go to Go, at every channel count (likewise once).
            for fmt in fmts:
                if fmt not in GO_FORMATS:
                    continue
                for n in b.bulk_channels:
                    r = Row(
                        "bulk",
                        f"{n} ch",
                        fmt + report.GO_SUFFIX,
                        loop,
                        transport,
                        "MiB/s",
                        baseline=RAW_STREAMS,
                        extra={"channels": n, "note": "Go to Go, the Go library deployed systems use"},
                        x=n,
                    )
                    jobs.append(
                        Job(r, lambda fmt=fmt, n=n: go_bulk(fmt, len(payload), n, b.time_limit, args.cpus))
                    )
    if "messages" in want:
        jobs += sc.message_jobs(peer, loop, transport, fmts, list(b.message_sizes), b.messages)
    if "rr" in want:
        jobs += sc.rr_jobs(peer, loop, transport, fmts, list(b.rr_channels), b.seconds)
    if "churn" in want:
        jobs += sc.churn_jobs(peer, loop, transport, fmts, b.seconds)
    await interleave(jobs, b.repeat, time_limit=b.time_limit, progress=progress)
    rows += [j.row for j in jobs]
    if "scale" in want:
        for count in b.scale_counts:
            for fmt in fmts:
                rows.append(await sc.scale_isolated(fmt, count, loop, transport, progress))
    if "slow" in want:
        for stack in (RAW_STREAMS, *fmts):
            rows.append(
                await sc.slow_reader(
                    stack,
                    [] if stack == RAW_STREAMS else [stack],
                    int(b.slow_mib * MIB),
                    b.slow_delay_us,
                    loop,
                    transport,
                    progress,
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the suite; exit status 1 if any measurement failed."""
    parser = build_parser()
    args = parser.parse_args(argv)
    return run(args, argv if argv is not None else sys.argv[1:])


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the suite for parsed ``args`` (``argv`` is recorded in the report)."""
    b = budget_from(args)
    if b.repeat < 1 or b.bulk_mib <= 0 or b.messages < 1 or b.seconds <= 0:
        raise SystemExit("--repeat, --bulk-size, --messages and --seconds must be positive")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    status = 0
    if "soak" in args.scenarios:
        if args.minutes <= 0:
            raise SystemExit("--minutes must be positive")
        from benchmarks import soak

        status = soak.run(args.formats, args.minutes, out, args.seed, progress=not args.quiet)
        args.scenarios = [s for s in args.scenarios if s != "soak"]
        if not args.scenarios:
            return status
    versions = {"python": platform.python_version(), "polymux": polymux.__version__}
    if "uvloop" in args.loops:
        import uvloop

        versions["uvloop"] = uvloop.__version__
    # Go rows: built (once per source change) before anything is timed.
    wants_go = not args.no_go and "bulk" in args.scenarios and bool(set(args.formats) & set(GO_FORMATS))
    go_missing = go_available() if wants_go else None
    args.go_rows = wants_go and go_missing is None
    meta: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python -m benchmarks " + shlex.join(argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
        "versions": versions,
        "mode": "full" if args.full else "quick",
        "repeat": b.repeat,
        "budget": b.__dict__,
        "formats": args.formats,
        "scenarios": args.scenarios,
        "node": None if args.no_node else (node_available() or "used for bulk 1 ch (tcp)"),
        "go": "used for bulk (tcp)" if args.go_rows else go_missing,
        "tracing": "included" if tracing_available() else "TODO: polymux.tracing.CaptureRecorder not found",
    }
    if go_missing is not None:
        meta["notes"] = [f"no Go reference rows: {go_missing}"]
    if not args.quiet:
        print(f"polymux benchmarks ({meta['mode']}): {meta['machine']}; {meta['versions']}", flush=True)
    rows: list[Row] = []
    started = time.perf_counter()
    args.cpus = None if args.no_pin else cpu_pair()
    meta["pinned"] = (
        f"sender on CPU {args.cpus[0]}, receiver on CPU {args.cpus[1]}" if args.cpus else "no (--no-pin)"
    )
    allowed = os.sched_getaffinity(0) if args.cpus else set()
    with tempfile.TemporaryDirectory(prefix="polymux-bench-out-") as tmp:
        for loop in args.loops:
            for transport in args.transports:
                peer = Peer(loop, transport, args.formats, args.cpus[1] if args.cpus else None).start()
                try:
                    pin(args.cpus[0] if args.cpus else None)
                    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
                        rows += runner.run(run_combo(peer, loop, transport, args, b, tmp))
                finally:
                    if allowed:
                        os.sched_setaffinity(0, allowed)
                    peer.stop()
    meta["seconds"] = round(time.perf_counter() - started, 1)
    (out / "results.md").write_text(report.markdown(rows, meta))
    report.write_json(out / "results.json", rows, meta)
    pngs, no_plots = report.plots_if_possible(out, rows)
    if no_plots is not None:
        print(f"polymux benchmarks: {no_plots}", file=sys.stderr, flush=True)
    if not args.quiet:
        print(
            f"\nwrote {out / 'results.md'}, {out / 'results.json'} and {len(pngs)} plots in {meta['seconds']} s"
        )
        print((out / "results.md").read_text())
    return 1 if status or any(r.errors for r in rows) else 0
