"""Chat through the fault proxy, on every format, several seeds each, with default session
settings and the reconnecting client's defaults (its ping after 15 s of quiet, 10 s for an
answer; the backoff's 0.5-15 s): two members who both connect through the proxy say
messages in turn while the proxy gives their first connections faults drawn from the seed
(cuts by FIN, RST or silently at a random byte offset, stalls, holds, 1-byte pieces,
latency). Each member ends up with every message of the room exactly once and in room
order (the server's numbers 1..N, no gap, no repeat), nothing counted lost, and each
message said reaches the room once (the server dropped what was sent again).

The same with the server restarted mid-way: the room's numbering starts again (a new
epoch), and each member shows every message said after the restart once, in order.

The loop's clock jumps ahead when it only waits (tests/faults/warp.py): a silent cut costs
the client's ping interval and timeout in virtual time. A failure prints the seed and the
proxy's plans; ``POLYMUX_FAULT_SEED=<seed>`` replays one (``POLYMUX_CHAT_SEEDS=n``: n
seeds per format, 3 by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from typing import Any

import pytest

import polymux
from polymux.apps.chat import ChatServer
from polymux.apps.chatclient import ReconnectingChatClient
from polymux.apps.common import conversation_options

from . import warp
from .proxy import ALL_CUTS, FaultProxy, Plan, draw


pytestmark = pytest.mark.fuzz

SEED = int(os.environ.get("POLYMUX_FAULT_SEED", "0")) or None
SEEDS = int(os.environ.get("POLYMUX_CHAT_SEEDS", "3"))
FAULTY = 4
"""Connections that get a fault (then the proxy forwards cleanly: the conversation ends)."""
FAULT_MODES = ("pieces", "stall", "delay", "hold", "cut", "cut", "cut")
MESSAGES = 40
"""Messages each member says."""
ROOM = "lobby"


class Run:
    """One conversation: the server (restartable), the proxy, two members, what they saw."""

    def __init__(self, fmt: str, seed: int) -> None:
        self.fmt = fmt
        self.seed = seed
        self.rng = random.Random(seed)
        self.log: list[str] = []
        self.server: polymux.Server | None = None
        self.proxy: FaultProxy | None = None
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.outages = 0
        """Connections the members lost (and came back from)."""

    def plan(self, index: int, rng: random.Random) -> Plan:
        if index >= FAULTY:
            return Plan("clean")
        # A chat connection carries a few KiB: faults land within the first 3 KiB, past
        # the format's handshake and the join.
        plan = draw(rng, FAULT_MODES, ALL_CUTS, cut_range=3000, hold_range=(0.5, 5.0))
        plan.limits = tuple(None if x is None else 200 + x for x in plan.limits)  # type: ignore[assignment]
        return plan

    async def start_server(self) -> int:
        chat = ChatServer(log=self.log.append, history=1000)
        self.server = await polymux.start_server(
            chat.handle, "127.0.0.1", 0, protocol=self.fmt, **conversation_options(self.fmt)
        )
        return self.server.port

    async def stop_server(self) -> None:
        assert self.server is not None
        self.server.close()  # every session aborted: the members see their connections reset
        await self.server.wait_closed()
        self.log.append("-- server stopped")

    def describe(self) -> str:
        proxy = self.proxy.describe() if self.proxy is not None else "no proxy"
        log = "\n".join(f"  {line}" for line in self.log[-30:])
        tails = "\n".join(
            f" {nick}: {[_short(e) for e in events[-12:]]}" for nick, events in self.events.items()
        )
        return (
            f"{self.fmt} seed {self.seed} (POLYMUX_FAULT_SEED={self.seed}): {proxy}\n server:\n{log}\n{tails}"
        )


def _short(event: dict[str, Any]) -> str:
    kind = event.get("type")
    if kind == "msg":
        return f"msg {event.get('seq')} {event.get('text')}"
    if kind in ("disconnected", "reconnecting", "gave up"):
        return f"{kind} {event.get('reason', '')}"[:80]
    return str(kind)


async def converse(run: Run, *, restart: bool) -> None:
    port = await run.start_server()
    run.proxy = proxy = FaultProxy(port, run.seed, plan=run.plan)
    proxy_port = await proxy.start()

    async def connect() -> polymux.Session:
        return await polymux.connect("127.0.0.1", proxy_port, protocol=run.fmt)

    nicks = ("ada", "bob")
    members = {nick: ReconnectingChatClient(connect, nick, retries=30) for nick in nicks}
    run.events = {nick: [] for nick in nicks}
    total = len(nicks) * MESSAGES
    restarted_at: int | None = None
    seen: dict[str, set[str]] = {nick: set() for nick in nicks}
    progress = asyncio.Event()

    async def collect(nick: str) -> None:
        # Until every message of the room after the restart (or all) came to this member.
        texts = seen[nick]
        async for event in members[nick]:
            run.events[nick].append(event)
            if event["type"] == "gave up":
                raise AssertionError(f"{nick} gave up: {event}")
            if event["type"] == "msg":
                texts.add(event["text"])
                progress.set()
            if len(texts) >= total and (restarted_at is None or _after_restart(run.events[nick])):
                return

    try:
        for member in members.values():
            await member.start([ROOM])
        readers = [asyncio.ensure_future(collect(nick)) for nick in nicks]
        async with asyncio.timeout(3600):  # virtual seconds: a hang fails, it does not wait
            for i in range(MESSAGES):
                for nick in nicks:
                    await members[nick].say(ROOM, f"{nick}-{i}")
                if restart and i == MESSAGES // 2:
                    # Everything said so far reached both members; then the server goes
                    # away (what it relayed to nobody yet would be lost, and not counted:
                    # a restarted server does not know what it had).
                    said = 2 * (i + 1)
                    while any(len(texts) < said for texts in seen.values()):
                        progress.clear()
                        await progress.wait()
                    await run.stop_server()
                    restarted_at = i + 1
                    await asyncio.sleep(run.rng.uniform(1.0, 8.0))
                    proxy.upstream_port = await run.start_server()
                    run.log.append("-- server restarted")
                if run.rng.random() < 0.3:
                    await asyncio.sleep(run.rng.uniform(0.0, 2.0))  # quiet spells: pings go
            for member in members.values():
                await member.delivered()
            await asyncio.gather(*readers)
        run.outages = sum(m.outages for m in members.values())
    finally:
        for member in members.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(member.close(), 30)
        await proxy.aclose()
        if run.server is not None:
            run.server.close()
            await run.server.wait_closed()
    _check(run, restarted_at)


def _after_restart(events: list[dict[str, Any]]) -> bool:
    """Every message said after the restart came after the last welcome of a new epoch."""
    return len(_since_restart(events)) >= len(("ada", "bob")) * (MESSAGES - MESSAGES // 2 - 1)


def _since_restart(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    epochs = [e.get("epoch") for e in events if e["type"] == "welcome"]
    last_epoch = epochs[-1] if epochs else None
    start = 0
    for k, event in enumerate(events):
        if event["type"] == "welcome" and event.get("epoch") == last_epoch:
            start = k
            break
    return [e for e in events[start:] if e["type"] == "msg"]


def _check(run: Run, restarted_at: int | None) -> None:
    for nick, events in run.events.items():
        messages = [e for e in events if e["type"] == "msg"]
        lost = [e for e in events if e["type"] == "catchup" and e.get("lost")]
        if restarted_at is None:
            seqs = [e["seq"] for e in messages]
            assert seqs == list(range(1, 2 * MESSAGES + 1)), f"{nick} saw {seqs}\n{run.describe()}"
            assert not lost, f"{nick}: {lost}\n{run.describe()}"
        else:
            after = _since_restart(events)
            seqs = [e["seq"] for e in after]
            assert seqs == list(range(1, len(seqs) + 1)), (
                f"{nick} after the restart: {seqs}\n{run.describe()}"
            )
        texts = [e["text"] for e in messages]
        assert len(texts) == len(set(texts)), f"{nick} saw a message twice\n{run.describe()}"
        for sender in ("ada", "bob"):
            said = [int(t.split("-")[1]) for t in texts if t.startswith(f"{sender}-")]
            assert said == sorted(said), f"{nick} saw {sender}'s out of order: {said}\n{run.describe()}"
            assert said == list(range(MESSAGES)), (
                f"{nick} missed some of {sender}'s: {said}\n{run.describe()}"
            )
    if restarted_at is not None:
        assert "-- server restarted" in run.log, run.describe()


def _seeds(fmt: str) -> list[int]:
    if SEED is not None:
        return [SEED]
    base = sum(map(ord, fmt)) * 1000 + 17
    return [base + k for k in range(SEEDS)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
def test_chat_through_faults_delivers_every_message_once_in_order(fmt: str) -> None:
    outages = 0

    async def main() -> None:
        nonlocal outages
        for seed in _seeds(fmt):
            print(f"chat fault seed for {fmt}: {seed} (POLYMUX_FAULT_SEED={seed} replays it)")
            run = Run(fmt, seed)
            await converse(run, restart=False)
            print(
                f"  {run.proxy.connections if run.proxy else 0} connections, {run.outages} lost and resumed"
            )
            outages += run.outages

    warp.run(main())
    if SEED is None:
        assert outages > 0, "no seed cut a connection: the faults miss the conversation"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
def test_chat_through_a_server_restart(fmt: str) -> None:
    async def main() -> None:
        seed = SEED or sum(map(ord, fmt)) * 7 + 3
        print(f"chat restart seed for {fmt}: {seed} (POLYMUX_FAULT_SEED={seed} replays it)")
        run = Run(fmt, seed)
        await converse(run, restart=True)
        assert run.outages >= 2, run.describe()  # both members lost the server

    warp.run(main())
