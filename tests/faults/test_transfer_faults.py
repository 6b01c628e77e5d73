"""File transfer through the fault proxy, on every format, several seeds each, with default
session settings: the sender (``polymux.apps.filetransfer.send_with_retries``) reconnects by
itself after every cut (FIN, RST, silent), stall, hold and 1-byte split the proxy draws for
the first connections, and resumes each file from what the receiver has, until every file's
SHA-256 is verified; no partial file is ever under a final name, and the partial files are
gone at the end. The same with the receiver restarted mid-way (a new ``Receiver`` over the
same directory: it resumes from the partial files on disk).

The loop's clock jumps ahead when it only waits (tests/faults/warp.py): a silent cut is
noticed after the keepalive's 25 s and the backoff waits up to 30 s, in virtual time. A
failure prints the seed and the proxy's plans; ``POLYMUX_FAULT_SEED=<seed>`` replays one
(``POLYMUX_TRANSFER_SEEDS=n``: n seeds per format, 3 by default).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
from pathlib import Path

import pytest

import polymux
from polymux.apps.common import conversation_options
from polymux.apps.filetransfer import PART_SUFFIX, Receiver, Transfer, collect, send_with_retries

from . import warp
from .proxy import ALL_CUTS, FaultProxy, Plan, draw


pytestmark = pytest.mark.fuzz

SEED = int(os.environ.get("POLYMUX_FAULT_SEED", "0")) or None
SEEDS = int(os.environ.get("POLYMUX_TRANSFER_SEEDS", "3"))
FAULTY = 3
"""Connections that get a fault (then the proxy forwards cleanly: the transfer ends)."""
FAULT_MODES = ("pieces", "stall", "delay", "hold", "cut", "cut")
TOTAL = 600 * 1024


def make_files(root: Path, rng: random.Random) -> dict[str, str]:
    """Three files of random bytes (sizes drawn from ``rng``); returns name -> SHA-256."""
    digests = {}
    for i in range(3):
        data = rng.randbytes(rng.randrange(TOTAL // 6, TOTAL // 2))
        name = f"d{i % 2}/file-{i}.bin"
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    return digests


def tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


class Run:
    """One transfer: the receiver side (restartable), the proxy, and what was seen."""

    def __init__(self, fmt: str, seed: int, root: Path) -> None:
        self.fmt = fmt
        self.seed = seed
        self.rng = random.Random(seed)
        self.src, self.dest = root / "src", root / "dest"
        self.digests = make_files(self.src, self.rng)
        self.log: list[str] = []
        self.receiver: Receiver | None = None
        self.server: polymux.Server | None = None
        self.proxy: FaultProxy | None = None
        self.misnamed: list[str] = []

    def plan(self, index: int, rng: random.Random) -> Plan:
        if index >= FAULTY:
            return Plan("clean")
        # Cuts land past the handshake and within the transfer (TOTAL bytes at most).
        plan = draw(rng, FAULT_MODES, ALL_CUTS, cut_range=TOTAL, hold_range=(0.5, 5.0))
        plan.limits = tuple(None if x is None else 4096 + x for x in plan.limits)  # type: ignore[assignment]
        return plan

    async def start_receiver(self) -> int:
        self.receiver = Receiver(self.dest, log=self.log.append)
        self.server = await polymux.start_server(
            self.receiver.handle, "127.0.0.1", 0, protocol=self.fmt, **conversation_options(self.fmt)
        )
        return self.server.port

    async def stop_receiver(self) -> None:
        assert self.server is not None
        self.server.close()  # every session aborted: the sender sees its connection reset
        await self.server.wait_closed()
        self.log.append("-- receiver stopped")

    def check_names(self) -> None:
        """No file under its final name that is not whole and verified."""
        for p in self.dest.rglob("*"):
            name = p.relative_to(self.dest).as_posix()
            if p.is_file() and not name.endswith(PART_SUFFIX):
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                if digest != self.digests.get(name):
                    self.misnamed.append(name)

    def describe(self) -> str:
        proxy = self.proxy.describe() if self.proxy is not None else "no proxy"
        log = "\n".join(f"  {line}" for line in self.log[-30:])
        return f"{self.fmt} seed {self.seed} (POLYMUX_FAULT_SEED={self.seed}): {proxy}\n receiver:\n{log}"


async def transfer(run: Run, *, restart: bool) -> list[Transfer]:
    port = await run.start_receiver()
    run.proxy = proxy = FaultProxy(port, run.seed, plan=run.plan)
    proxy_port = await proxy.start()
    transfers = collect([run.src])
    watcher: asyncio.Task[None] | None = None

    progressed = asyncio.Event()

    async def restart_midway() -> None:
        # Once a tenth of the bytes are in, the receiver goes away for a few seconds.
        await progressed.wait()
        await run.stop_receiver()
        await asyncio.sleep(run.rng.uniform(1.0, 8.0))
        proxy.upstream_port = await run.start_receiver()
        run.log.append("-- receiver restarted")

    async def connect() -> polymux.Session:
        return await polymux.connect("127.0.0.1", proxy_port, protocol=run.fmt)

    def watch(_t: Transfer) -> None:
        run.check_names()
        if sum(t.done for t in transfers) >= TOTAL // 10:
            progressed.set()

    try:
        if restart:
            watcher = asyncio.ensure_future(restart_midway())
        async with asyncio.timeout(3600):  # virtual seconds: a hang fails, it does not wait
            result = await send_with_retries(
                connect,
                transfers,
                retries=30,
                progress="none",
                on_progress=watch,
                rng=random.Random(run.seed),
            )
        if watcher is not None:
            await watcher
        assert result.gave_up is None
    finally:
        if watcher is not None:
            watcher.cancel()
        await proxy.aclose()
        if run.server is not None:
            run.server.close()
            await run.server.wait_closed()
    return transfers


def _check(run: Run, transfers: list[Transfer], *, restart: bool) -> None:
    failures = [f"{t.name}: {t.status} {t.error}" for t in transfers if t.status not in ("done", "unchanged")]
    assert not failures, f"{failures}\n{run.describe()}"
    assert all(t.sha256 == run.digests[t.name] for t in transfers), run.describe()
    assert tree(run.dest) == run.digests, run.describe()  # every file whole, no partial file left
    assert not run.misnamed, f"not whole under a final name: {run.misnamed}\n{run.describe()}"
    if restart:
        assert "-- receiver restarted" in run.log, run.describe()


def _seeds(fmt: str) -> list[int]:
    if SEED is not None:
        return [SEED]
    base = sum(map(ord, fmt)) * 1000
    return [base + k for k in range(SEEDS)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
def test_files_resume_through_faults_until_verified(fmt: str, tmp_path: Path) -> None:
    async def main() -> None:
        for seed in _seeds(fmt):
            root = tmp_path / str(seed)
            print(f"transfer fault seed for {fmt}: {seed} (POLYMUX_FAULT_SEED={seed} replays it)")
            run = Run(fmt, seed, root)
            transfers = await transfer(run, restart=False)
            _check(run, transfers, restart=False)

    warp.run(main())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
def test_files_resume_after_the_receiver_restarts(fmt: str, tmp_path: Path) -> None:
    async def main() -> None:
        seed = SEED or sum(map(ord, fmt)) * 7
        print(f"restart seed for {fmt}: {seed} (POLYMUX_FAULT_SEED={seed} replays it)")
        run = Run(fmt, seed, tmp_path)
        transfers = await transfer(run, restart=True)
        _check(run, transfers, restart=True)

    warp.run(main())
