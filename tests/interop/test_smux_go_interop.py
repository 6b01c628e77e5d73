"""smux against the Go library that deployed systems speak: xtaci/smux (the Debian package
``golang-github-xtaci-smux-dev``, 1.5.16), driven by the Go peer ``go/smux_peer`` over a raw
socket (built by ``gobuild.py``; the header of its ``main.go`` lists its behaviours and what
the library does on the wire).

Protocol versions 1 (``protocol="smux"``) and 2 (``"smux-v2"``), both roles (the connecting
side is the smux client), TCP and unix sockets; the shapes 16 x 1 MiB, 64 x 4 MiB, 256 x 64 KiB,
1 x 64 MiB and 8 x 0 B, every byte compared; NOP keepalive both ways (the Go library closes a
session that hears nothing for three of its intervals), the end of a stream from either side
at once (smux has no reset: an abort is a FIN), a burst of 1,024 opens both ways, a version
mismatch, and polymux's half-close, which keeps unread data. The Go peer's wire tap checks
every frame polymux sent: the session's version, known commands only.

End of a message: xtaci/smux 1.5.16 has no half-close (``Close()`` sends FIN and forgets the
stream with its unread data), and v1.5.54+ drops unread data when a FIN meets its
``CloseWrite()`` (issue 25 item 4). So the Go side never ends a stream before it has read the
answer: every exchange carries its length (``echo/<n>``, ``big/<n>``), and the stream ends
only after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

import polymux
from polymux._types import BytesLike
from polymux.wire.smux import Cmd, Decoder

from .gobuild import GoUnavailable, build
from .peers import PeerProcess, pattern, start_peer, unix_path


pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

MIB = 1 << 20
SHAPES = [(16, MIB), (64, 4 * MIB), (256, 64 * 1024), (1, 64 * MIB), (8, 0)]
SHAPE_IDS = [f"{n}x{size}" for n, size in SHAPES]
VERSIONS = [pytest.param("smux", id="v1"), pytest.param("smux-v2", id="v2")]


def _version(protocol: str) -> str:
    return "1" if protocol == "smux" else "2"


@pytest.fixture(scope="session")
def go_smux_peer() -> Path:
    """The Go peer over xtaci/smux (``go/smux_peer``), built if its sources changed."""
    try:
        return build("smux_peer")
    except GoUnavailable as exc:
        pytest.fail(f"interop tests against xtaci/smux (they are never skipped): {exc}")


_tmp: list[Path] = []


@pytest.fixture(autouse=True)
def _socket_folder(tmp_path: Path) -> Iterator[None]:
    """Unix sockets of the test go in its tmp_path (removed by pytest)."""
    _tmp.append(tmp_path)
    yield
    _tmp.remove(tmp_path)


async def _until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:  # noqa: ASYNC109
    """Wait until ``predicate()`` holds (polling the loop), or fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def _where(transport: str) -> list[str]:
    return ["--tcp", "0"] if transport == "tcp" else ["--unix", unix_path(_tmp[-1])]


def _clean_wire(result: dict[str, object], protocol: str) -> None:
    """Every frame the Go side received from polymux had the session's version and a known
    command."""
    rx = result["wire"]["rx"]  # type: ignore[index]
    assert rx["bad"] == 0, rx  # type: ignore[index]
    assert set(rx["versions"]) <= {_version(protocol)}, rx  # type: ignore[index]
    if protocol == "smux":
        assert "UPD" not in rx["kinds"], rx  # type: ignore[index]


async def _connect(go: PeerProcess, transport: str, protocol: str, **options: object) -> polymux.Session:
    where = await go.listening()
    if transport == "tcp":
        return await polymux.connect("127.0.0.1", int(where), protocol=protocol, **options)  # type: ignore[arg-type]
    return await polymux.connect_unix(where, protocol=protocol, **options)  # type: ignore[arg-type]


async def _serve(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    transport: str,
    protocol: str,
    **options: object,
) -> tuple[polymux.Server, list[str]]:
    if transport == "tcp":
        server = await polymux.start_server(handler, "127.0.0.1", 0, protocol=protocol, **options)  # type: ignore[arg-type]
        return server, ["--tcp", str(server.port)]
    path = unix_path(_tmp[-1])
    server = await polymux.start_unix_server(handler, path, protocol=protocol, **options)  # type: ignore[arg-type]
    return server, ["--unix", path]


async def _finish_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(polymux.PolymuxError, ConnectionError):
        await writer.wait_closed()


async def _go_server(go_smux_peer: Path, transport: str, protocol: str, *args: str) -> PeerProcess:
    return await start_peer(
        go_smux_peer,
        "--listen",
        *_where(transport),
        "--mode",
        "responder",
        "--version",
        _version(protocol),
        *args,
        watchdog=180,
    )


# -- polymux opens, the Go library responds --------------------------------------------------


async def _open(session: polymux.Session, name: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await session.open_channel()
    writer.write(name.encode() + b"\n")
    return reader, writer


async def _echo(session: polymux.Session, i: int, size: int) -> None:
    """``echo/<size>``: send the pattern in 64 KiB writes while reading the echo back; only
    then half-close, and read the Go side's FIN."""
    reader, writer = await _open(session, f"echo/{size}")
    data = pattern(i, size)

    async def send() -> None:
        view = memoryview(data)
        for off in range(0, size, 64 * 1024):
            writer.write(view[off : off + 64 * 1024])
            await writer.drain()

    sender = asyncio.create_task(send())
    received = await reader.readexactly(size)
    await sender
    assert received == data, f"echo {i}: differs"
    writer.write_eof()
    assert await reader.read() == b""
    await _finish_writer(writer)


@pytest.mark.parametrize(("channels", "size"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("protocol", VERSIONS)
async def test_polymux_client_go_server(
    go_smux_peer: Path, protocol: str, transport: str, channels: int, size: int
) -> None:
    """polymux (the client) opens every stream at once; the Go library echoes."""
    go = await _go_server(go_smux_peer, transport, protocol)
    try:
        session = await _connect(go, transport, protocol)
        async with session:
            await asyncio.wait_for(asyncio.gather(*(_echo(session, i, size) for i in range(channels))), 150)
            assert session.exception is None
        result = await go.finish()
    finally:
        await go.aclose()
    assert result["ok"] is True, result
    assert result["handled"] == {"echo": channels}, result
    assert result["unfinished"] == [], result
    _clean_wire(result, protocol)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("protocol", VERSIONS)
async def test_polymux_client_behaviours(go_smux_peer: Path, protocol: str, transport: str) -> None:
    """Against the Go library as responder: our half-close keeps unread data (issue 25 item
    4), a sha256-checked 32 MiB stream, our abort (a FIN: the Go side reads the end), and the
    Go side ending a stream at once (we read EOF; what we write after it is dropped)."""
    go = await _go_server(go_smux_peer, transport, protocol)
    try:
        session = await _connect(go, transport, protocol)
        async with session:

            async def halfclose() -> None:
                # We half-close first; the Go side answers 900 KiB (within our 1 MiB window:
                # 1.5.16 cannot wait for window after our FIN) and closes. We read nothing
                # until both FINs are through and the stream is gone from the engine.
                reader, writer = await _open(session, f"halfclose/{900 * 1024}")
                handle = writer.transport.handle  # type: ignore[attr-defined]
                writer.write(b"z" * 300_000)
                writer.write_eof()
                await _until(lambda: not session.engine.is_live(handle))
                assert await reader.readline() == b"300000\n"
                assert await reader.read() == pattern(5, 900 * 1024)
                await _finish_writer(writer)

            async def big() -> None:
                reader, writer = await _open(session, f"big/{32 * MIB}")
                data = pattern(99, 32 * MIB)
                writer.write(data)
                want = f"{len(data)} {hashlib.sha256(data).hexdigest()}".encode()
                assert await reader.readexactly(len(want)) == want
                writer.write_eof()
                assert await reader.read() == b""
                await _finish_writer(writer)

            async def abort() -> None:
                reader, writer = await _open(session, "abort/1000")
                writer.write(b"r" * 1000)
                assert await reader.readline() == b"ready\n"
                writer.transport.abort()  # smux has no reset: a FIN

            async def closed_by_go() -> None:
                reader, writer = await _open(session, "close/10")
                writer.write(b"c" * 10)
                assert await reader.read() == b"closing\n"  # then the Go side's FIN
                writer.write(b"after the peer closed")  # dropped by the library
                await writer.drain()
                await _finish_writer(writer)

            await asyncio.wait_for(asyncio.gather(halfclose(), big(), abort(), closed_by_go()), 120)
            assert session.exception is None
        result = await go.finish()
    finally:
        await go.aclose()
    assert result["ok"] is True, result
    assert result["handled"] == {"halfclose": 1, "big": 1, "abort": 1, "abort_seen": 1, "close": 1}, result
    _clean_wire(result, protocol)


async def _burst(session: polymux.Session, opens: int) -> int:
    """Open ``opens`` channels at once, each echoing 1 KiB; return how many came back."""

    async def one(i: int) -> bool:
        reader, writer = await _open(session, "echo/1024")
        data = pattern(i, 1024)
        writer.write(data)
        ok = await reader.readexactly(1024) == data
        writer.write_eof()
        ok = ok and await reader.read() == b""
        await _finish_writer(writer)
        return ok

    results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(opens))), 120)
    return sum(results)


@pytest.mark.parametrize("protocol", VERSIONS)
async def test_burst_of_1024_opens_loses_none(go_smux_peer: Path, protocol: str) -> None:
    """1,024 channels opened at once (the Go library queues up to 1,024 for Accept() and
    stops reading beyond: nothing is refused)."""
    go = await _go_server(go_smux_peer, "tcp", protocol)
    try:
        session = await _connect(go, "tcp", protocol)
        async with session:
            assert await _burst(session, 1024) == 1024
        result = await go.finish()
    finally:
        await go.aclose()
    assert result["ok"] is True and result["handled"] == {"echo": 1024}, result
    _clean_wire(result, protocol)


class NopCounter:
    """A capture sink that counts the NOPs a session receives."""

    def __init__(self, protocol: str) -> None:
        self.decoder = Decoder(int(_version(protocol)))
        self.nops = 0

    def __call__(self, info: Mapping[str, str]) -> NopCounter:
        return self

    def received(self, data: BytesLike) -> None:
        self.nops += sum(1 for f in self.decoder.feed(bytes(data)) if f.cmd == Cmd.NOP)

    def sent(self, chunks: Sequence[BytesLike]) -> None:
        return

    def close(self) -> None:
        return


@pytest.mark.parametrize("protocol", VERSIONS)
async def test_keepalive_both_ways_go_server(go_smux_peer: Path, protocol: str) -> None:
    """NOPs every 50 ms each way. The Go library closes a session that hears nothing for
    150 ms (3 intervals): ours keep it open; its NOPs keep ours (nothing answers a NOP)."""
    go = await _go_server(go_smux_peer, "unix", protocol, "--keepalive-ms", "50")
    counter = NopCounter(protocol)
    try:
        session = await _connect(
            go, "unix", protocol, keepalive_interval=0.05, keepalive_timeout=0.1, capture=counter
        )
        async with session:
            reader, writer = await _open(session, "nops/10")
            assert await asyncio.wait_for(reader.readline(), 30) == b"nops 10\n"
            await _until(lambda: counter.nops >= 10)
            writer.write_eof()
            assert await reader.read() == b""
            await _finish_writer(writer)
            assert not session.is_closed and session.exception is None
        result = await go.finish()
    finally:
        await go.aclose()
    assert result["ok"] is True and result["handled"] == {"nops": 1}, result
    assert result["wire"]["rx"]["nop_ids"] == {"0": result["wire"]["rx"]["kinds"]["NOP"]}, result  # type: ignore[index]


@pytest.mark.parametrize(("ours", "theirs"), [("smux", "smux-v2"), ("smux-v2", "smux")])
async def test_version_mismatch(go_smux_peer: Path, ours: str, theirs: str) -> None:
    """Both ends must be configured alike: the Go library ends the session on our first
    frame ("invalid protocol") without a word, and our open channel fails with an error
    that says so and names the other version (issue 40 item 7)."""
    go = await _go_server(go_smux_peer, "tcp", theirs)
    try:
        session = await _connect(go, "tcp", ours, keepalive_interval=None)
        with pytest.raises(polymux.SessionClosed) as info:  # at the open, or when reading
            reader, _writer = await _open(session, "echo/1")
            await asyncio.wait_for(reader.read(), 30)
        await session.aclose()
        result = await go.finish()
    finally:
        await go.aclose()
    assert result["accept_error"] == "invalid protocol", result
    error = info.value
    assert error.ending in (polymux.SessionClosed.CLOSED, polymux.SessionClosed.RESET), error
    assert error.diagnosis is not None and f"another version of it ({theirs})" in error.diagnosis
    assert "the server" in error.diagnosis and error.diagnosis in str(error)


# -- the Go library opens, polymux responds ----------------------------------------------------


async def respond(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The polymux side when the Go peer opens the streams (its conventions: header of
    ``go/smux_peer/main.go``): answer, then wait for the Go side's FIN, then end."""
    name = (await reader.readline()).decode().rstrip("\n")
    kind, _, arg = name.partition("/")
    try:
        if kind == "echo":
            left = int(arg)
            while left:
                data = await reader.read(min(left, 65536))
                assert data, f"{name}: the peer ended early"
                left -= len(data)
                writer.write(data)
                await writer.drain()
            assert await reader.read() == b""
        elif kind == "big":
            data = await reader.readexactly(int(arg))
            writer.write(f"{len(data)} {hashlib.sha256(data).hexdigest()}".encode())
            await writer.drain()
            assert await reader.read() == b""
        # close/x (and anything else): end at once
        writer.write_eof()
        await writer.drain()
    finally:
        await _finish_writer(writer)


async def _go_client(go_smux_peer: Path, protocol: str, where: list[str], *args: str) -> dict[str, object]:
    go = await start_peer(
        go_smux_peer,
        "--connect",
        *where,
        "--mode",
        "driver",
        "--version",
        _version(protocol),
        *args,
        watchdog=180,
    )
    try:
        return await go.finish(200)
    finally:
        await go.aclose()


@pytest.mark.parametrize(("channels", "size"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("protocol", VERSIONS)
async def test_go_client_polymux_server(
    go_smux_peer: Path, protocol: str, transport: str, channels: int, size: int
) -> None:
    """The Go library (the client) opens every stream; a polymux server responds."""
    server, where = await _serve(respond, transport, protocol)
    async with server:
        result = await _go_client(
            go_smux_peer, protocol, where, "--channels", str(channels), "--size", str(size)
        )
    assert result["ok"] is True, result
    assert result["echo_ok"] == channels, result
    assert result["close_stream"] == {"bytes": 0, "err": "<nil>"}, result
    _clean_wire(result, protocol)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
@pytest.mark.parametrize("protocol", VERSIONS)
async def test_go_client_behaviours(go_smux_peer: Path, protocol: str, transport: str) -> None:
    """A sha256-checked 32 MiB stream, and NOPs every 50 ms each way with the Go library's
    timeout at 150 ms: the session lives through it all."""
    server, where = await _serve(respond, transport, protocol, keepalive_interval=0.05, keepalive_timeout=0.1)
    async with server:
        result = await _go_client(
            go_smux_peer, protocol, where, "--channels", "4", "--size", "65536", "--big", str(32 * MIB),
            "--keepalive-ms", "50", "--min-nops", "10",
        )  # fmt: skip
    assert result["ok"] is True, result
    assert result["echo_ok"] == 4 and result["nops_seen"] >= 10, result  # type: ignore[operator]
    assert result["session_closed_early"] is False, result
    _clean_wire(result, protocol)


@pytest.mark.parametrize("protocol", VERSIONS)
async def test_burst_of_1024_opens_from_the_go_library(go_smux_peer: Path, protocol: str) -> None:
    """1,024 streams opened at once and all held open: they fit ``max_inbound_channels``."""
    server, where = await _serve(respond, "tcp", protocol)
    async with server:
        result = await _go_client(
            go_smux_peer, protocol, where, "--channels", "1024", "--size", "1024", "--hold"
        )
    assert result["ok"] is True, result
    assert result["echo_ok"] == 1024, result
    _clean_wire(result, protocol)
