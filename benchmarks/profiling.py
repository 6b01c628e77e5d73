"""Sampling profiles of the hot paths with py-spy: ``python -m benchmarks.profiling``.

Runs one scenario (bulk on 1 channel, or 64-byte messages) in a loop for ``--seconds``
against a receiving process (:mod:`benchmarks.peer`), while ``py-spy record`` samples the
receiver or the sender (or both, one after the other). Prints the functions with the
most samples on top of the stack (self time) and the most samples anywhere on the stack
(inclusive time), and keeps the collapsed stacks (``*.txt``, for flamegraph.pl or
speedscope) in ``--out``.

    .venv/bin/pip install py-spy
    .venv/bin/python -m benchmarks.profiling --format mstream-v3 --scenario bulk --side both
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import os
import shutil
import sys
import time
from pathlib import Path

import polymux
from benchmarks import scenarios as sc
from benchmarks.common import MIB, RAW_STREAMS, loop_factory
from benchmarks.peer import Peer, profile_text


def top_functions(collapsed: Path, n: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """(total samples, top self, top inclusive) from a py-spy ``--format raw`` file."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        total += k
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        own[_short(frames[-1])] += k
        for f in {_short(f) for f in frames}:
            incl[f] += k
    return total, own.most_common(n), incl.most_common(n)


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py:123)" keeping polymux paths readable.
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    if "/polymux/" in where:
        where = "polymux/" + where.split("/polymux/", 1)[1]
    elif "/" in where:
        where = where.rsplit("/", 1)[1]
    return f"{name} ({where})"


async def _drive(peer: Peer, fmt: str, scenario: str, until: float, mib: int) -> int:
    payload = memoryview(bytes(mib * MIB))
    ep = peer.endpoints[fmt]
    runs = 0
    while True:  # at least once
        if scenario == "bulk":
            if fmt == RAW_STREAMS:
                await sc.bulk_raw_streams(ep, payload, 1)
            else:
                await sc.bulk_polymux(ep, fmt, payload, 1)
        elif fmt == RAW_STREAMS:
            await sc.messages_raw(ep, 64, 20_000, 1)
        else:
            await sc.messages_polymux(ep, fmt, 64, 20_000, 1)
        runs += 1
        if time.perf_counter() >= until:
            return runs


async def _record(pid: int, seconds: float, out: Path, native: bool) -> None:
    cmd = ["py-spy", "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "250", "--format", "raw"]
    cmd += ["-o", str(out), "--nonblocking"]
    if native:
        cmd.append("--native")
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"py-spy failed ({proc.returncode}): {err.decode(errors='replace')[-500:]}")


def main(argv: list[str] | None = None) -> int:
    """Profile one scenario; print the top functions."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.profiling", description=__doc__.splitlines()[0])
    p.add_argument("--format", default="mstream-v3", choices=[*polymux.PROTOCOLS, RAW_STREAMS])
    p.add_argument("--scenario", default="bulk", choices=["bulk", "messages"])
    p.add_argument("--side", default="both", choices=["receiver", "sender", "both"])
    p.add_argument("--loop", default="uvloop", choices=["asyncio", "uvloop"])
    p.add_argument("--transport", default="tcp", choices=["tcp", "unix"])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--mib", type=int, default=128, help="MiB per bulk transfer")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--native", action="store_true", help="py-spy --native (C frames too)")
    p.add_argument(
        "--tool",
        default="py-spy",
        choices=["py-spy", "cprofile"],
        help="py-spy (sampling, wall clock: includes time the process was runnable but "
        "descheduled) or cprofile (deterministic, CPU time via time.process_time)",
    )
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "profiles")
    args = p.parse_args(argv)
    if args.tool == "py-spy" and shutil.which("py-spy") is None:
        p.error("py-spy is not on PATH (.venv/bin/pip install py-spy; run with .venv/bin on PATH)")
    args.out.mkdir(parents=True, exist_ok=True)
    sides = ["receiver", "sender"] if args.side == "both" else [args.side]
    formats = [] if args.format == RAW_STREAMS else [args.format]
    for side in sides:
        peer = Peer(args.loop, args.transport, formats).start()
        out = args.out / f"{args.scenario}_{args.format}_{args.loop}_{args.transport}_{side}.txt"

        async def run(side: str = side, peer: Peer = peer, out: Path = out) -> int:

            # One warm-up transfer, then drive while py-spy samples.
            await _drive(peer, args.format, args.scenario, 0.0, 8)
            until = time.perf_counter() + args.seconds + 1.5
            pid = peer.pid if side == "receiver" else os.getpid()
            assert pid is not None
            if args.tool == "cprofile":
                profiler = cProfile.Profile(time.process_time)
                if side == "receiver":
                    await peer.ask("cprofile_on")
                else:
                    profiler.enable()
                runs = await _drive(peer, args.format, args.scenario, until - 1.5, args.mib)
                if side == "receiver":
                    text = await peer.ask("cprofile_off")
                else:
                    profiler.disable()
                    text = profile_text(profiler, args.top)
                out.with_suffix(".cprofile.txt").write_text(text)
                print(f"\n## cProfile (CPU time): {args.scenario}, {args.format}, {side}, {runs} runs\n")
                print(text)
                return -runs
            driver = asyncio.create_task(_drive(peer, args.format, args.scenario, until, args.mib))
            await _record(pid, args.seconds, out, args.native)
            return await driver

        try:
            with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
                runs = runner.run(run())
        finally:
            peer.stop()
        if runs < 0:
            continue
        total, own, incl = top_functions(out, args.top)
        print(
            f"\n## {args.scenario}, {args.format}, {args.loop}/{args.transport}, {side} "
            f"({total} samples, {runs} transfers; {out.name})\n"
        )
        print("| self % | function |\n|---|---|")
        for name, k in own:
            print(f"| {100 * k / max(total, 1):.1f} | `{name}` |")
        print("\n| inclusive % | function |\n|---|---|")
        for name, k in incl:
            print(f"| {100 * k / max(total, 1):.1f} | `{name}` |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
