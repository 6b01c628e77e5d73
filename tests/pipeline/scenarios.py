"""The captures the pipeline tests analyse, made with polymux itself.

Each scenario records into its own folder with ``polymux.tracing.CaptureRecorder`` and
returns what it expects the report to say, keyed by session id. A channel's traffic is
compared as the pair (data bytes client->server, data bytes server->client): every channel
of a scenario moves a different number of bytes, so the multiset of pairs per session
identifies every channel without knowing the decoder's channel keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import polymux
from polymux.tracing import CaptureRecorder, read_capture
from polymux.wire import yamux


Pairs = list[tuple[int, int]]


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:  # noqa: ASYNC109
    """Wait until ``predicate()`` holds (polling the loop), or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


CHANNELS = 4


def request_size(index: int) -> int:
    """Bytes the client sends on channel ``index`` (distinct per channel, frames split)."""
    return 3000 + 12_347 * index


def response_size(received: int) -> int:
    """Bytes the server answers after receiving ``received``."""
    return received // 3 + 11


@dataclass
class Expected:
    """What the report must show for the captures of a scenario."""

    pairs: dict[str, Pairs] = field(default_factory=dict)
    """session -> sorted (c2s, s2c) data bytes of its channels that carried data."""
    formats: dict[str, str] = field(default_factory=dict)
    """session -> format."""
    roles: dict[str, str] = field(default_factory=dict)
    """session -> role of the recording side."""


def sessions_in(folder: Path) -> dict[str, tuple[str, str]]:
    """session -> (format, role) of every capture file under ``folder``."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted(folder.rglob("*.pmcap.parquet")):
        capture = read_capture(path)
        found[capture.session] = (capture.format, capture.role)
    return found


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Server side: count the request until EOF, answer ``response_size`` bytes, close."""
    total = 0
    while data := await reader.read(65536):
        total += len(data)
    writer.write(b"r" * response_size(total))
    writer.write_eof()
    await writer.drain()
    writer.close()
    with contextlib.suppress(polymux.PolymuxError, ConnectionError):
        await writer.wait_closed()


ROTATED = ("yamux", "mstream-v2")
"""Formats whose test captures rotate into several files."""


def one_way(fmt: str) -> bool:
    """omnistreams streams carry data one way only (opener to acceptor)."""
    return fmt.startswith("omnistreams")


async def format_session(fmt: str, folder: Path) -> Expected:
    """One session of ``fmt`` over TCP, recorded on both sides: CHANNELS channels, each a
    request and an answer (for one-way formats only the request). yamux and mstream-v2
    captures rotate every 32 KiB, so those sessions span several files."""
    rotate = fmt in ROTATED
    recorder = CaptureRecorder(
        folder, rotate_bytes=32 * 1024 if rotate else 64 << 20, batch_bytes=8 * 1024 if rotate else 1 << 20
    )
    received: dict[str, int] = {}
    all_in = asyncio.Event()

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        total = 0
        while data := await reader.read(65536):
            total += len(data)
        received[writer.get_extra_info("channel_name")] = total
        if len(received) == CHANNELS:
            all_in.set()
        writer.close()

    try:
        handler = count if one_way(fmt) else _answer
        server = await polymux.start_server(handler, "127.0.0.1", 0, protocol=fmt, capture=recorder)
        async with server:
            session = await polymux.connect("127.0.0.1", server.port, protocol=fmt, capture=recorder)
            async with session:

                async def one(i: int) -> tuple[int, int]:
                    reader, writer = await session.open_channel(f"ch/{i}")
                    writer.write(b"q" * request_size(i))
                    writer.write_eof()
                    await writer.drain()
                    if one_way(fmt):
                        writer.close()
                        return request_size(i), 0
                    answer = await reader.read()
                    writer.close()
                    assert len(answer) == response_size(request_size(i))
                    return request_size(i), len(answer)

                pairs = sorted(await asyncio.gather(*(one(i) for i in range(CHANNELS))))
                if one_way(fmt):
                    await all_in.wait()
                    assert sorted(received.values()) == [p[0] for p in pairs]
    finally:
        recorder.close()
    expected = Expected()
    for session_id, (recorded_fmt, role) in sessions_in(folder).items():
        expected.pairs[session_id] = pairs
        expected.formats[session_id] = recorded_fmt
        expected.roles[session_id] = role
    assert sorted(expected.roles.values()) == ["client", "server"], expected.roles
    return expected


SLOW_WINDOW = 16 * 1024
SLOW_SIZE = 4 * SLOW_WINDOW
FAST_SIZE = SLOW_WINDOW // 4
HOLD = 0.4
"""Seconds the slow channel's reader stays stopped once its sender is out of credit."""


async def slow_reader_session(folder: Path, fmt: str = "mstream-v2") -> tuple[Expected, int]:
    """A session whose server reads channel ``slow`` only after its sender has been out of
    credit for ``HOLD`` seconds; channels ``fast/0``, ``fast/1`` send less than a window.
    Recorded on the client. Returns the expectation and the slow channel's request size."""
    recorder = CaptureRecorder(folder)
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if writer.get_extra_info("channel_name") == "slow":
            await release.wait()
        await _answer(reader, writer)

    try:
        server = await polymux.start_server(
            handler, "127.0.0.1", 0, protocol=fmt, receive_window=SLOW_WINDOW, ack_min=SLOW_WINDOW // 8
        )
        async with server:
            session = await polymux.connect(
                "127.0.0.1",
                server.port,
                protocol=fmt,
                capture=recorder,
                receive_window=SLOW_WINDOW,
                ack_min=SLOW_WINDOW // 8,
            )
            async with session:

                async def send(name: str, size: int, slow: bool) -> tuple[int, int]:
                    reader, writer = await session.open_channel(name)
                    writer.write(b"s" * size)
                    if slow:
                        # the sender is out of credit once data waits in the channel
                        await until(lambda: writer.transport.get_write_buffer_size() > 0)
                        await asyncio.sleep(HOLD)  # the stall being measured, not a synchronisation
                        release.set()
                    writer.write_eof()
                    await writer.drain()
                    answer = await reader.read()
                    writer.close()
                    return size, len(answer)

                pairs = sorted(
                    await asyncio.gather(
                        send("slow", SLOW_SIZE, True),
                        send("fast/0", FAST_SIZE, False),
                        send("fast/1", FAST_SIZE + 1, False),
                    )
                )
    finally:
        recorder.close()
    expected = Expected()
    for session_id, (recorded_fmt, role) in sessions_in(folder).items():
        expected.pairs[session_id] = pairs
        expected.formats[session_id] = recorded_fmt
        expected.roles[session_id] = role
    return expected, SLOW_SIZE


VIOLATION_OFFSET = 12 + 12 + 5
"""Where the injected bad yamux header starts in the client's stream."""


def violation_capture(folder: Path) -> tuple[str, int]:
    """A yamux capture (client side) whose client stream has a header with version 7 at
    ``VIOLATION_OFFSET``: an open (WindowUpdate|SYN), a 5-byte data frame, then the bad one.
    Returns (session, offset)."""
    recorder = CaptureRecorder(folder)
    sink = recorder({"format": "yamux", "role": "client", "local": "127.0.0.1:1", "peer": "127.0.0.1:2"})
    good = yamux.encode_header(yamux.Type.WINDOW_UPDATE, yamux.Flag.SYN, 1, 0) + (
        yamux.encode_header(yamux.Type.DATA, 0, 1, 5) + b"hello"
    )
    assert len(good) == VIOLATION_OFFSET
    bad = struct.pack(">BBHII", 7, 0, 0, 1, 3) + b"xyz"
    sink.sent([good])
    sink.received(yamux.encode_header(yamux.Type.WINDOW_UPDATE, yamux.Flag.ACK, 1, 0))
    sink.sent([bad])
    sink.close()
    recorder.close()
    (session,) = sessions_in(folder)
    return session, VIOLATION_OFFSET


NODE_CHANNELS = 3
NODE_SIZE = 50_000
NODE_BIG = 400_000


async def _node_respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """tests/interop's yamux responder: the opener writes ``<name>\\n`` first."""
    name = (await reader.readline()).decode().rstrip("\n")
    try:
        if name.startswith("echo/"):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        elif name.startswith("halfclose/"):
            total = 0
            while data := await reader.read(65536):
                total += len(data)
            writer.write(str(total).encode())
        elif name.startswith("big/"):
            digest = hashlib.sha256()
            total = 0
            while data := await reader.read(1 << 20):
                digest.update(data)
                total += len(data)
            writer.write(f"{total} {digest.hexdigest()}".encode())
        elif name.startswith("error/"):
            writer.transport.abort()
            return
        writer.write_eof()
        await writer.drain()
    finally:
        writer.close()
        with contextlib.suppress(polymux.PolymuxError, ConnectionError):
            await writer.wait_closed()


async def node_session(folder: Path, node_dir: Path) -> Expected:
    """The Node reference peer (npm ``@chainsafe/libp2p-yamux``, tests/interop/node) drives
    a polymux yamux server, recorded on polymux's side (role server)."""
    recorder = CaptureRecorder(folder)
    try:
        server = await polymux.start_server(_node_respond, "127.0.0.1", 0, protocol="yamux", capture=recorder)
        async with server:
            proc = await asyncio.create_subprocess_exec(
                "node",
                str(node_dir / "yamux_peer.mjs"),
                "--connect",
                "--tcp",
                str(server.port),
                "--mode",
                "driver",
                "--channels",
                str(NODE_CHANNELS),
                "--size",
                str(NODE_SIZE),
                "--big",
                str(NODE_BIG),
                "--timeout-ms",
                "60000",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 90)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert proc.returncode == 0, err.decode()[-3000:]
            assert b'"ok":true' in out, out.decode()[-3000:]
    finally:
        recorder.close()
    big_digest = hashlib.sha256(_node_pattern(99, NODE_BIG)).hexdigest()
    pairs = [(len(f"echo/{i}\n") + NODE_SIZE, NODE_SIZE) for i in range(NODE_CHANNELS)]
    pairs += [(len("halfclose/x\n") + 300_000, len("300000"))]
    pairs += [(len("error/x\n"), 0)]
    pairs += [(len("big/x\n") + NODE_BIG, len(f"{NODE_BIG} {big_digest}"))]
    expected = Expected()
    for session_id, (fmt, role) in sessions_in(folder).items():
        expected.pairs[session_id] = sorted(pairs)
        expected.formats[session_id] = fmt
        expected.roles[session_id] = role
    return expected


def _node_pattern(index: int, size: int) -> bytes:
    block = bytes((j * 31 + index * 7) & 0xFF for j in range(256))
    return block * (size // 256) + block[: size % 256]


CLIENT = ("127.0.0.1", 40000)
SERVER = ("127.0.0.1", 9000)


def write_pcap(chunks: Iterable[tuple[int, str, bytes]], target: Path, mss: int = 1460) -> str:
    """Write a capture's chunks as a loopback TCP conversation (handshake, data segments of
    at most ``mss`` bytes with real sequence and ack numbers, FIN both ways) with dpkt.
    Returns the flow's session name as ``read_pcap`` gives it."""
    import dpkt

    ends = {"c2s": (CLIENT, SERVER), "s2c": (SERVER, CLIENT)}
    seq = {"c2s": 1000, "s2c": 5000}
    chunk_list = list(chunks)
    first = chunk_list[0][0] if chunk_list else 0

    def packet(direction: str, flags: int, payload: bytes = b"") -> bytes:
        (src, sport), (dst, dport) = ends[direction]
        other = "s2c" if direction == "c2s" else "c2s"
        tcp = dpkt.tcp.TCP(
            sport=sport, dport=dport, seq=seq[direction], ack=seq[other], flags=flags, win=65535
        )
        tcp.data = payload
        ip = dpkt.ip.IP(src=socket.inet_aton(src), dst=socket.inet_aton(dst), p=dpkt.ip.IP_PROTO_TCP, ttl=64)
        ip.data = tcp
        ip.len = len(ip)
        eth = dpkt.ethernet.Ethernet(type=dpkt.ethernet.ETH_TYPE_IP, data=ip)
        return bytes(eth)

    with target.open("wb") as handle:
        writer = dpkt.pcap.Writer(handle)
        t = first / 1e9 - 0.001
        writer.writepkt(packet("c2s", dpkt.tcp.TH_SYN), ts=t)
        seq["c2s"] += 1
        writer.writepkt(packet("s2c", dpkt.tcp.TH_SYN | dpkt.tcp.TH_ACK), ts=t)
        seq["s2c"] += 1
        writer.writepkt(packet("c2s", dpkt.tcp.TH_ACK), ts=t)
        for time_ns, direction, data in chunk_list:
            for off in range(0, len(data), mss):
                piece = bytes(data[off : off + mss])
                writer.writepkt(
                    packet(direction, dpkt.tcp.TH_ACK | dpkt.tcp.TH_PUSH, piece), ts=time_ns / 1e9
                )
                seq[direction] += len(piece)
        last = (chunk_list[-1][0] if chunk_list else first) / 1e9
        for direction in ("c2s", "s2c"):
            writer.writepkt(packet(direction, dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK), ts=last)
            seq[direction] += 1
    return f"{CLIENT[0]}:{CLIENT[1]}-{SERVER[0]}:{SERVER[1]}"


def copy_tree(source: Path, target: Path) -> None:
    """Copy a folder of captures."""
    shutil.copytree(source, target)
