"""Packet captures of every format, made in the tests (never checked in): a recording TCP
proxy sits between the two peers, and what it forwarded is written as a pcap file (dpkt)
with the proxy's own client-side addresses.

The peers: the npm reference implementations the interop tests run (``tests/interop/
node``), driven by polymux (MultiplexingStream v1/v2/v3, yamux, @libp2p/mplex, multiplex)
or driving a polymux server (@libp2p/mplex and multiplex, whose own NewStream names and
frame sizes are what tells the two apart); polymux on both ends for the formats without an
npm peer over TCP (Streamux, omnistreams in both numberings).

:func:`made_flows` makes them once per test run (the tracing and the pipeline tests share
them) and returns a :class:`MadeFlow` per capture: the pcap, and what decoding it must
give (format, detection verdict, data bytes each way, channel names).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dpkt

import polymux
from interop.peers import finish_node, install_node_peers, start_node
from interop.test_mplex_interop import responder as mplex_responder
from polymux.tracing import Chunk, decode_chunks

from . import pcaputil


SIZES = (5_000, 70_001, 300_007)
"""Bytes polymux sends on its channels (echoed back)."""

BIG_FRAME = 1_300_000
"""One write sent as one frame (multiplex, ``send_frame`` 2 MiB): over mplex's limit."""

NODE_DRIVER = ("--channels", "3", "--size", "65536", "--big", "2200000")
"""The Node driver's scenario (mplex_peer.mjs): 3 echo streams of 64 KiB, name, half-close,
error and one 2.2 MB write (a single frame in multiplex: over mplex's 1 MiB)."""


@dataclass
class MadeFlow:
    """One capture and what decoding it must give."""

    name: str
    """The test id."""
    pcap: Path
    session: str
    """The flow's session id in the pcap (``client-server``)."""
    format: str
    """The format the records must carry (what the flow is decoded as)."""
    verdict: str
    """``str(Detection)``: the format, or ``"ambiguous: mplex or multiplex"``."""
    c2s: int
    """Data bytes client to server."""
    s2c: int
    names: set[str] = field(default_factory=set)
    """Channel names the records must carry (empty: the format has none)."""
    retried: bool = False
    """The detected format fails on this flow and another candidate is decoded."""
    chunks: list[Chunk] = field(default_factory=list, repr=False)


# -- the recording proxy ------------------------------------------------------------------


@dataclass
class Recording:
    client: tuple[str, int]
    proxy: tuple[str, int]
    chunks: list[Chunk] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class RecordingProxy:
    """Forwards each connection to ``target`` and records the chunks it forwards, in the
    order it forwards them (``time_ns`` from ``time.time_ns``)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.recordings: list[Recording] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rec = Recording(writer.get_extra_info("peername")[:2], writer.get_extra_info("sockname")[:2])
        self.recordings.append(rec)
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, direction: str) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(256 * 1024):
                    rec.chunks.append((time.time_ns(), direction, data))
                    dst.write(data)
                    await dst.drain()
                if dst.can_write_eof():
                    dst.write_eof()

        try:
            await asyncio.gather(pump(reader, up_writer, "c2s"), pump(up_reader, writer, "s2c"))
        finally:
            for w in (writer, up_writer):
                w.close()
            rec.done.set()

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def pcap_packets(rec: Recording, mss: int = 32_768) -> list[tuple[int, bytes]]:
    """The TCP packets of one recorded connection (handshake, data, FIN both ways)."""
    p = pcaputil.Packets(rec.client, rec.proxy, (1000, 2000), dpkt.pcap.DLT_EN10MB)
    p.handshake(rec.chunks[0][0] - 1000)
    for t, direction, data in rec.chunks:
        for pos in range(0, len(data), mss):
            p.data(t, direction, data[pos : pos + mss])
    p.fin(rec.chunks[-1][0] + 1000)
    return p.out


def session_of(rec: Recording) -> str:
    return f"{rec.client[0]}:{rec.client[1]}-{rec.proxy[0]}:{rec.proxy[1]}"


# -- the scenarios ------------------------------------------------------------------------


def _payload(i: int, size: int) -> bytes:
    return bytes((j * 13 + i * 5) & 0xFF for j in range(256)) * (size // 256 + 1)


async def _drive_echo(session: polymux.Session, line: bool, sizes: tuple[int, ...] = SIZES) -> None:
    """polymux opens ``echo/<i>`` channels, sends ``sizes[i]`` bytes (after a ``<name>\\n``
    line for peers that take the name from the data), ends and reads the echo."""

    async def one(i: int, size: int) -> None:
        name = f"echo/{i}"
        reader, writer = await session.open_pair(name)
        data = _payload(i, size)[:size]
        if line:
            writer.write(name.encode() + b"\n")
        writer.write(data)
        writer.write_eof()
        assert await reader.read() == data, name
        writer.close()

    await asyncio.gather(*(one(i, size) for i, size in enumerate(sizes)))


async def _echo_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()
    with contextlib.suppress(ConnectionError, polymux.PolymuxError):
        await writer.wait_closed()


async def _through_proxy(target_port: int, run: Callable[[int], Awaitable[None]]) -> Recording:
    proxy = RecordingProxy(("127.0.0.1", target_port))
    port = await proxy.start()
    try:
        await run(port)
        [rec] = proxy.recordings
        await asyncio.wait_for(rec.done.wait(), 20)
        return rec
    finally:
        await proxy.aclose()


async def polymux_drives_node(
    node_dir: Path, script: str, fmt: str, *args: str, sizes: tuple[int, ...] = SIZES, **options: Any
) -> Recording:
    proc = await start_node(
        node_dir / script, "--listen", "--tcp", "0", *args, "--mode", "responder", watchdog=60
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()
        assert line[:1] == ["LISTENING"], line

        async def run(port: int) -> None:
            async with await polymux.connect("127.0.0.1", port, protocol=fmt, **options) as session:
                await _drive_echo(session, script == "yamux_peer.mjs" or "libp2p" in args, sizes)

        rec = await _through_proxy(int(line[1]), run)
        result = await finish_node(proc, 60)
        assert result.get("ok") is True, result
        return rec
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def node_drives_polymux(node_dir: Path, fmt: str) -> Recording:
    impl = "libp2p" if fmt == "mplex" else "multiplex"
    async with await polymux.start_server(
        mplex_responder(libp2p=fmt == "mplex"), "127.0.0.1", 0, protocol=fmt
    ) as server:

        async def run(port: int) -> None:
            proc = await start_node(
                node_dir / "mplex_peer.mjs",
                "--impl", impl, "--connect", "--tcp", str(port), "--mode", "driver", *NODE_DRIVER,
                watchdog=60,
            )  # fmt: skip
            result = await finish_node(proc, 60)
            assert result.get("ok") is True, result

        return await _through_proxy(server.port, run)


async def polymux_both_ends(fmt: str) -> Recording:
    async with await polymux.start_server(_echo_handler, "127.0.0.1", 0, protocol=fmt) as server:

        async def run(port: int) -> None:
            async with await polymux.connect("127.0.0.1", port, protocol=fmt) as session:
                await _drive_echo(session, line=False)

        return await _through_proxy(server.port, run)


# -- all of them ------------------------------------------------------------------------------


def _totals(fmt: str, chunks: list[Chunk]) -> tuple[int, int, set[str]]:
    """Data bytes each way and channel names, decoding as the true format (no detection):
    the reference for the flows the Node peer drove. No violation allowed."""
    records = list(decode_chunks(fmt, chunks, session="reference"))
    assert not [r for r in records if r.frame_type in ("violation", "truncated")], fmt
    c2s = sum(r.length for r in records if r.frame_type == "data" and r.direction == "c2s")
    s2c = sum(r.length for r in records if r.frame_type == "data" and r.direction == "s2c")
    return c2s, s2c, {r.channel_name for r in records if r.channel_name is not None}


async def _make(folder: Path, node_dir: Path) -> list[MadeFlow]:
    echo = sum(SIZES)
    lines = sum(len(f"echo/{i}\n") for i in range(len(SIZES)))
    names = {f"echo/{i}" for i in range(len(SIZES))}
    ambiguous = "ambiguous: mplex or multiplex"
    plan: list[tuple[str, Callable[[], Awaitable[Recording]], dict[str, Any]]] = [
        (
            f"mstream-v{v}",
            lambda v=v: polymux_drives_node(
                node_dir, "mstream_peer.js", f"mstream-v{v}", "--version", str(v)
            ),
            {"format": f"mstream-v{v}", "verdict": f"mstream-v{v}", "c2s": echo, "s2c": echo, "names": names},
        )
        for v in (1, 2, 3)
    ]
    plan += [
        (
            "yamux",
            lambda: polymux_drives_node(node_dir, "yamux_peer.mjs", "yamux"),
            {"format": "yamux", "verdict": "yamux", "c2s": echo + lines, "s2c": echo},
        ),
        (
            "mplex-polymux-drives",
            lambda: polymux_drives_node(node_dir, "mplex_peer.mjs", "mplex", "--impl", "libp2p"),
            {"format": "mplex", "verdict": ambiguous, "c2s": echo + lines, "s2c": echo, "names": names},
        ),
        (
            # One channel's frame is over mplex's 1 MiB, after the first bytes: detected as
            # ambiguous, decoded as mplex, which fails there, then as multiplex.
            "multiplex-polymux-drives",
            lambda: polymux_drives_node(
                node_dir,
                "mplex_peer.mjs",
                "multiplex",
                "--impl",
                "multiplex",
                sizes=(*SIZES, BIG_FRAME),
                send_frame=2 * 1024 * 1024,
            ),
            {
                "format": "multiplex",
                "verdict": ambiguous,
                "c2s": echo + BIG_FRAME,
                "s2c": echo + BIG_FRAME,
                "names": {*names, f"echo/{len(SIZES)}"},
                "retried": True,
            },
        ),
        (
            "mplex-node-drives",
            lambda: node_drives_polymux(node_dir, "mplex"),
            {"format": "mplex", "verdict": "mplex"},
        ),
        (
            # polymux's reset carries its message (at once, before any data): multiplex
            "multiplex-node-drives",
            lambda: node_drives_polymux(node_dir, "multiplex"),
            {"format": "multiplex", "verdict": "multiplex"},
        ),
        (
            "streamux",
            lambda: polymux_both_ends("streamux"),
            {"format": "streamux", "verdict": "streamux", "c2s": echo, "s2c": echo},
        ),
    ]
    plan += [
        (
            fmt,
            lambda fmt=fmt: polymux_both_ends(fmt),
            {"format": fmt, "verdict": fmt, "c2s": echo, "s2c": echo, "names": names},
        )
        for fmt in ("omnistreams", "omnistreams-legacy")
    ]
    made: list[MadeFlow] = []
    packets: list[tuple[int, bytes]] = []
    for name, make, expect in plan:
        rec = await asyncio.wait_for(make(), 90)
        own = pcap_packets(rec)
        packets += own
        pcap = folder / f"{name}.pcap"
        pcaputil.write(pcap, own)
        if "c2s" not in expect:  # the Node peer drove: decode as the true format for reference
            c2s, s2c, seen = _totals(expect["format"], rec.chunks)
            expect = {**expect, "c2s": c2s, "s2c": s2c, "names": seen}
        made.append(MadeFlow(name=name, pcap=pcap, session=session_of(rec), chunks=rec.chunks, **expect))
    packets.sort(key=lambda p: p[0])
    pcaputil.write(folder / "all.pcap", packets)
    return made


FLOW_NAMES = [
    "mstream-v1",
    "mstream-v2",
    "mstream-v3",
    "yamux",
    "mplex-polymux-drives",
    "multiplex-polymux-drives",
    "mplex-node-drives",
    "multiplex-node-drives",
    "streamux",
    "omnistreams",
    "omnistreams-legacy",
]
"""The captures :func:`made_flows` makes, by :attr:`MadeFlow.name`."""

_MADE: dict[str, list[MadeFlow]] = {}


def made_flows(folder: Path) -> list[MadeFlow]:
    """The captures (made on first use, in ``folder``; later calls return the same)."""
    if "flows" not in _MADE:
        node_dir = install_node_peers("packet-capture tests")
        folder.mkdir(parents=True, exist_ok=True)
        _MADE["flows"] = asyncio.run(_make(folder, node_dir))
    return _MADE["flows"]


def flows_by_name(folder: Path) -> dict[str, MadeFlow]:
    """:func:`made_flows` by name (every one of :data:`FLOW_NAMES`)."""
    made = {f.name: f for f in made_flows(folder)}
    assert sorted(made) == sorted(FLOW_NAMES)
    return made
