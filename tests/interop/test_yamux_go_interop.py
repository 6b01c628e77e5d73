"""yamux against the Go library that deployed systems speak: hashicorp/yamux (the Debian
package ``golang-github-hashicorp-yamux-dev``, snapshot df201c7), driven by the Go peer
``go/yamux_peer`` over a raw socket (built by ``gobuild.py``; see the header of its
``main.go`` for its behaviours and what the library does on the wire).

Both roles (the connecting side is the yamux client), TCP and unix sockets; the shapes
16 x 1 MiB, 64 x 4 MiB, 256 x 64 KiB, 1 x 64 MiB and 8 x 0 B, every byte compared; keepalive
pings both ways, GoAway both ways, resets both ways, bursts of 1,024 opens both ways, the
library's accept backlog, and ``max_inbound_channels``. Every case also checks that the
library logged no warning: no frame for a stream it had closed ("frame for missing
stream"), no reset for a full backlog ("backlog exceeded") unless the case is about that.

The Go library's ``Stream.Read`` returns EOF after a local ``Close()`` as soon as its buffer
is empty (before the peer's FIN), so when the Go peer opens a stream it never half-closes
before it has read the answer: the echo is read back in full first, and ``big/<n>``,
``goawaycheck/`` and ``bulk/<n>`` carry their length or end in a line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

import polymux

from .peers import PeerProcess, echo_through, pattern, start_peer, unix_path


pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

MIB = 1 << 20
SHAPES = [(16, MIB), (64, 4 * MIB), (256, 64 * 1024), (1, 64 * MIB), (8, 0)]
SHAPE_IDS = [f"{n}x{size}" for n, size in SHAPES]
CROSSED = "frame for missing stream: Vsn:0 Type:1 Flags:0 "
"""The Go peer's count of pure window updates that reached hashicorp/yamux after it had closed
the stream both ways: an update we sent before its FIN reached us (the two crossed on the
wire). Nothing can prevent that (docs/yamux-smux-interop.md); an update sent after we had
processed the FIN is another matter (tests/aio/test_yamux_stale_credit.py)."""


_tmp: list[Path] = []


@pytest.fixture(autouse=True)
def _socket_folder(tmp_path: Path) -> Iterator[None]:
    """Unix sockets of the test go in its tmp_path (removed by pytest)."""
    _tmp.append(tmp_path)
    yield
    _tmp.remove(tmp_path)


def _where(transport: str) -> list[str]:
    return ["--tcp", "0"] if transport == "tcp" else ["--unix", unix_path(_tmp[-1])]


def _quiet(result: dict[str, object], *allowed: str, crossed: bool = False) -> None:
    """hashicorp/yamux logged none of its warnings (except ``allowed``; with ``crossed``,
    window updates that crossed a stream's FIN)."""
    log = result.get("yamux_log")
    assert isinstance(log, dict), result
    pure = log.get(CROSSED, 0) if crossed else 0
    counts = {k: v - (pure if k in ("[WARN]", "frame for missing stream") else 0) for k, v in log.items()}
    noisy = {
        k: v
        for k, v in counts.items()
        if v and k != CROSSED and k not in allowed and not (k == "[WARN]" and allowed)
    }
    assert not noisy, f"hashicorp/yamux logged {noisy}"


async def _connect(go: PeerProcess, transport: str, **options: object) -> polymux.Session:
    where = await go.listening()
    if transport == "tcp":
        return await polymux.connect("127.0.0.1", int(where), protocol="yamux", **options)  # type: ignore[arg-type]
    return await polymux.connect_unix(where, protocol="yamux", **options)  # type: ignore[arg-type]


async def _serve(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    transport: str,
    **options: object,
) -> tuple[polymux.Server, list[str]]:
    if transport == "tcp":
        server = await polymux.start_server(handler, "127.0.0.1", 0, protocol="yamux", **options)  # type: ignore[arg-type]
        return server, ["--tcp", str(server.port)]
    path = unix_path(_tmp[-1])
    server = await polymux.start_unix_server(handler, path, protocol="yamux", **options)  # type: ignore[arg-type]
    return server, ["--unix", path]


async def _finish_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(polymux.PolymuxError, ConnectionError):
        await writer.wait_closed()


# -- polymux opens, the Go library responds --------------------------------------------------


async def _open(session: polymux.Session, name: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await session.open_channel(name)
    writer.write(name.encode() + b"\n")
    return reader, writer


async def _echo(session: polymux.Session, i: int, size: int) -> None:
    """``echo/<i>``: send ``size`` pattern bytes in 64 KiB writes, half-close, read the echo."""
    reader, writer = await _open(session, f"echo/{i}")
    data = pattern(i, size)
    received = await echo_through(reader, writer, data)
    assert received == data, f"echo/{i}: {len(received)} bytes back of {size}"
    await _finish_writer(writer)


async def _go_server(go_yamux_peer: Path, transport: str, *args: str) -> PeerProcess:
    return await start_peer(
        go_yamux_peer, "--listen", *_where(transport), "--mode", "responder", *args, watchdog=180
    )


@pytest.mark.parametrize(("channels", "size"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_polymux_client_go_server(
    go_yamux_peer: Path, transport: str, channels: int, size: int
) -> None:
    """polymux (the client) opens every stream at once and closes with GoAway(normal)."""
    go = await _go_server(go_yamux_peer, transport)
    try:
        session = await _connect(go, transport)
        async with session:
            assert await session.ping() >= 0
            await asyncio.wait_for(asyncio.gather(*(_echo(session, i, size) for i in range(channels))), 150)
        result = await go.finish()
    finally:
        await go.aclose()
    assert result["ok"] is True, result
    assert result["handled"] == {"echo": channels}, result
    assert result["unfinished"] == [], result
    assert result["remote_goaway"] == 0, result  # our aclose() said GoAway(normal)
    assert result["remote_pings"] >= 1, result
    _quiet(result, crossed=True)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_polymux_client_behaviours(go_yamux_peer: Path, transport: str) -> None:
    """Half-close, a sha256-checked 32 MiB stream and a reset from our side, each against
    the Go library as responder."""
    go = await _go_server(go_yamux_peer, transport)
    try:
        session = await _connect(go, transport)
        async with session:

            async def halfclose() -> None:
                reader, writer = await _open(session, "halfclose/x")
                writer.write(b"z" * 300_000)
                writer.write_eof()
                assert await reader.read() == b"300000"
                await _finish_writer(writer)

            async def big() -> None:
                reader, writer = await _open(session, "big/x")
                data = pattern(99, 32 * MIB)
                writer.write(data)
                writer.write_eof()
                assert (await reader.read()).decode() == f"{len(data)} {hashlib.sha256(data).hexdigest()}"
                await _finish_writer(writer)

            async def reset() -> None:
                reader, writer = await _open(session, "reset/1000")
                writer.write(b"r" * 1000)
                assert await reader.readline() == b"ready\n"
                writer.transport.abort()  # RST: the Go side must see "connection reset"

            await asyncio.wait_for(asyncio.gather(halfclose(), big(), reset()), 120)
        result = await go.finish()
    finally:
        await go.aclose()
    assert result["ok"] is True, result
    assert result["handled"] == {"halfclose": 1, "big": 1, "reset": 1, "reset_seen": 1}, result
    _quiet(result, crossed=True)


async def _burst(
    session: polymux.Session, opens: int, opened_before_gate: int, gate: asyncio.StreamWriter | None
) -> dict[str, int]:
    """Open ``opens`` channels at once, each echoing 1 KiB. With ``gate``: once
    ``opened_before_gate`` of them are open, tell the Go responder to accept again."""
    outcomes = {"ok": 0, "reset": 0}
    opened = 0
    enough = asyncio.Event()

    async def one(i: int) -> None:
        nonlocal opened
        reader, writer = await session.open_channel()
        opened += 1
        if opened == opened_before_gate:
            enough.set()
        data = pattern(i, 1024)
        writer.write(f"echo/{i}\n".encode() + data)
        writer.write_eof()
        try:
            assert await reader.read() == data
            outcomes["ok"] += 1
        except polymux.ChannelReset:
            outcomes["reset"] += 1
        await _finish_writer(writer)

    tasks = [asyncio.create_task(one(i)) for i in range(opens)]
    try:
        if gate is not None:
            await asyncio.wait_for(enough.wait(), 30)
            gate.write(b"open\n")  # after every SYN that could go out did
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    finally:
        for task in tasks:
            task.cancel()
    return outcomes


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_burst_of_1024_opens_loses_none(go_yamux_peer: Path, transport: str) -> None:
    """1,024 channels opened at once against hashicorp/yamux, whose accept backlog is 256:
    none is reset (``max_unacked_opens`` keeps at most 256 un-ACKed opens in flight)."""
    go = await _go_server(go_yamux_peer, transport)
    try:
        session = await _connect(go, transport)
        async with session:
            outcomes = await _burst(session, 1024, 1024, None)
        result = await go.finish()
    finally:
        await go.aclose()
    assert outcomes == {"ok": 1024, "reset": 0}, outcomes
    assert result["ok"] is True and result["handled"] == {"echo": 1024}, result
    _quiet(result)


async def test_open_channel_waits_for_room_in_the_peers_backlog(go_yamux_peer: Path) -> None:
    """The Go responder stops calling Accept() (a gate); 300 opens: 256 go out, the other
    44 wait in ``open_channel`` until ACKs come, instead of being reset by the library."""
    go = await _go_server(go_yamux_peer, "tcp", "--gate")
    try:
        session = await _connect(go, "tcp")
        async with session:
            gate_reader, gate = await _open(session, "gate/x")
            assert await asyncio.wait_for(gate_reader.readline(), 10) == b"gated\n"
            outcomes = await _burst(session, 300, 256, gate)
            gate.write_eof()
        result = await go.finish()
    finally:
        await go.aclose()
    assert outcomes == {"ok": 300, "reset": 0}, outcomes
    assert result["ok"] is True and result["handled"] == {"gate": 1, "echo": 300}, result
    _quiet(result)


async def test_opens_beyond_the_peers_backlog_are_reset_by_it(go_yamux_peer: Path) -> None:
    """With ``max_unacked_opens`` above the library's backlog, exactly the opens beyond its
    256 free slots are reset by it (RST from hashicorp/yamux: ChannelReset here); the others
    work."""
    go = await _go_server(go_yamux_peer, "tcp", "--gate")
    try:
        session = await _connect(go, "tcp", max_unacked_opens=300)
        async with session:
            gate_reader, gate = await _open(session, "gate/x")
            assert await asyncio.wait_for(gate_reader.readline(), 10) == b"gated\n"
            outcomes = await _burst(session, 300, 300, gate)
            gate.write_eof()
        result = await go.finish()
    finally:
        await go.aclose()
    assert outcomes == {"ok": 256, "reset": 44}, outcomes
    assert result["ok"] is True and result["handled"] == {"gate": 1, "echo": 256}, result
    log = result["yamux_log"]
    assert log["backlog exceeded"] == 44, log  # type: ignore[index]


async def test_keepalive_both_ways_go_server(go_yamux_peer: Path) -> None:
    """Keepalive pings every 50 ms each way: the Go library answers ours, we answer its."""
    go = await _go_server(go_yamux_peer, "unix", "--keepalive-ms", "50")
    try:
        session = await _connect(go, "unix", keepalive_interval=0.05)
        async with session:
            reader, writer = await _open(session, "pings/3")
            line = (await asyncio.wait_for(reader.readline(), 30)).decode().split()
            assert line[0] == "pings" and int(line[1]) >= 3 and int(line[2]) >= 3, line
            writer.write_eof()
            assert await reader.read() == b""
            await _finish_writer(writer)
            assert not session.is_closed
        result = await go.finish()
    finally:
        await go.aclose()
    assert result["ok"] is True, result
    _quiet(result)


async def test_goaway_from_the_go_library(go_yamux_peer: Path) -> None:
    """The Go library calls GoAway(): we open no more channels (SessionClosed, nothing
    sent), and a channel already open finishes normally."""
    go = await _go_server(go_yamux_peer, "tcp")
    try:
        session = await _connect(go, "tcp")
        async with session:
            reader, writer = await _open(session, "echo/0")
            writer.write(b"before")
            assert await reader.readexactly(6) == b"before"
            g_reader, g_writer = await _open(session, "goaway/x")
            assert await asyncio.wait_for(g_reader.readline(), 10) == b"goaway-sent\n"
            with pytest.raises(polymux.SessionClosed, match="going away"):
                await session.open_channel()
            writer.write(b"after")
            writer.write_eof()
            assert await reader.read() == b"after"
            g_writer.write_eof()
            assert await g_reader.read() == b""
            for w in (writer, g_writer):
                await _finish_writer(w)
        result = await go.finish()
    finally:
        await go.aclose()
    assert result["ok"] is True, result
    assert result["handled"] == {"echo": 1, "goaway": 1}, result
    assert result["wire"]["tx"]["goaway"] == [0], result  # type: ignore[index]
    _quiet(result)


# -- the Go library opens, polymux responds ----------------------------------------------------


async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The polymux side when the Go peer opens the streams (its conventions: header of
    ``go/yamux_peer/main.go``)."""
    name = (await reader.readline()).decode().rstrip("\n")
    kind, _, arg = name.partition("/")
    try:
        if kind == "echo":
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        elif kind == "big":
            data = await reader.readexactly(int(arg))
            writer.write(f"{len(data)} {hashlib.sha256(data).hexdigest()}".encode())
            await writer.drain()
            assert await reader.read() == b""
        elif kind == "error":
            writer.transport.abort()  # RST
            return
        elif kind == "goawaycheck":
            # The peer sent GoAway before this line: we must not open streams any more.
            assert await reader.readline() == b"sent\n"
            session = writer.transport.get_extra_info("session")
            try:
                await session.open_channel("after-goaway")
                answer = "opened (wrong)"
            except polymux.SessionClosed as exc:
                answer = f"refused: {exc}"
            writer.write(answer.encode() + b"\n")
            await writer.drain()
            assert await reader.read() == b""
        writer.write_eof()
        await writer.drain()
    finally:
        await _finish_writer(writer)


async def _go_client(go_yamux_peer: Path, where: list[str], *args: str) -> dict[str, object]:
    go = await start_peer(go_yamux_peer, "--connect", *where, "--mode", "driver", *args, watchdog=180)
    try:
        return await go.finish(200)
    finally:
        await go.aclose()


@pytest.mark.parametrize(("channels", "size"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_go_client_polymux_server(
    go_yamux_peer: Path, transport: str, channels: int, size: int
) -> None:
    """The Go library (the client) opens every stream; a polymux server responds."""
    server, where = await _serve(respond, transport)
    async with server:
        result = await _go_client(go_yamux_peer, where, "--channels", str(channels), "--size", str(size))
    assert result["ok"] is True, result
    assert result["echo_ok"] == channels, result
    assert result["error_stream"]["err"] == "connection reset", result  # type: ignore[index]
    _quiet(result)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_go_client_behaviours(go_yamux_peer: Path, transport: str) -> None:
    """A sha256-checked 32 MiB stream, keepalive pings every 50 ms each way, and GoAway
    from the Go client: afterwards our server side may not open channels."""
    server, where = await _serve(respond, transport, keepalive_interval=0.05)
    async with server:
        result = await _go_client(
            go_yamux_peer, where, "--channels", "4", "--size", "65536", "--big", str(32 * MIB),
            "--keepalive-ms", "50", "--min-pings", "3", "--goaway",
        )  # fmt: skip
    assert result["ok"] is True, result
    assert result["echo_ok"] == 4, result
    assert str(result["goaway_check"]).startswith("refused: "), result
    assert "going away" in str(result["goaway_check"]), result
    assert result["wire"]["tx"]["goaway"] == [0], result  # type: ignore[index]
    _quiet(result)


async def test_burst_of_1024_opens_from_the_go_library(go_yamux_peer: Path) -> None:
    """1,024 streams opened at once and all held open (the library's ``OpenStream`` keeps
    at most 256 un-ACKed; we acknowledge at once): all fit in ``max_inbound_channels``."""
    server, where = await _serve(respond, "tcp")
    async with server:
        result = await _go_client(go_yamux_peer, where, "--channels", "1024", "--size", "1024", "--hold")
    assert result["ok"] is True, result
    assert result["echo_ok"] == 1024, result
    _quiet(result)


@pytest.mark.parametrize("raised", [False, True])
async def test_max_inbound_channels_against_the_go_library(go_yamux_peer: Path, raised: bool) -> None:
    """hashicorp/yamux has no cap on concurrent streams; polymux keeps 1,024 by default (a
    safety bound: docs/yamux-smux-interop.md). 1,100 streams held open at once: the 76
    beyond it are reset, unless the server raises ``max_inbound_channels`` (and
    ``max_channels``)."""
    options: dict[str, object] = {"max_inbound_channels": 2048, "max_channels": 2048} if raised else {}
    server, where = await _serve(respond, "tcp", **options)
    async with server:
        result = await _go_client(
            go_yamux_peer, where, "--channels", "1100", "--size", "1024", "--hold", "--allow-resets"
        )
    assert result["ok"] is True, result
    expected = (1100, 0) if raised else (1024, 76)
    assert (result["echo_ok"], result["echo_reset"]) == expected, result
