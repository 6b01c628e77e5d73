"""The public asyncio API: clients and servers (TCP, unix, stream pairs, a subprocess's
stdio), incoming channels, channel names, plain protocols, half-close, close, reset,
graceful session close, option validation, packaging and the layering rule."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import hashlib
import importlib.resources
import os
import re
import sys
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

import polymux
from polymux import formats
from polymux.aio.channel import ChannelTransport


T = TypeVar("T")

ALL = ["mstream-v1", "mstream-v2", "mstream-v3"]

Serve = Callable[..., Awaitable[polymux.Server]]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def wait(aw: Awaitable[T], timeout: float = 5) -> T:  # noqa: ASYNC109
    """Await ``aw``, failing the test instead of hanging."""
    return await asyncio.wait_for(aw, timeout)


async def roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write ``data`` to an echoing channel and read it back."""
    writer.write(data)
    await wait(writer.drain())
    assert await wait(reader.readexactly(len(data))) == data


def channel_name(writer: asyncio.StreamWriter) -> str:
    return cast(str, writer.get_extra_info("channel_name"))


# -- clients and servers -------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_tcp_connect_and_serve(echo: Handler, protocol: str) -> None:
    async with await polymux.start_server(echo, "127.0.0.1", 0, protocol=protocol) as server:
        assert server.port > 0
        async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as session:
            assert session.protocol == protocol
            assert not session.is_closed
            assert session.get_extra_info("peername")[1] == server.port
            reader, writer = await wait(session.open_channel("tcp"))
            await roundtrip(reader, writer, b"hello over tcp")
            assert writer.get_extra_info("session") is session
            assert writer.get_extra_info("protocol_name") == protocol
            assert writer.get_extra_info("peername") == session.get_extra_info("peername")
            assert isinstance(writer.transport, ChannelTransport)
            assert len(server.sessions) == 1
        assert session.is_closed
        assert session.exception is None
    assert server.sessions == set()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_unix_connect_and_serve(echo: Handler, protocol: str, tmp_path: Path) -> None:
    path = tmp_path / "mux.sock"
    async with await polymux.start_unix_server(echo, path, protocol=protocol):
        async with await wait(polymux.connect_unix(path, protocol=protocol)) as session:
            assert session.protocol == protocol
            reader, writer = await wait(session.open_channel("unix"))
            await roundtrip(reader, writer, b"hello over a unix socket")
        assert session.is_closed


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_closing_the_server_closes_its_sessions(echo: Handler, protocol: str) -> None:
    async with await polymux.start_server(echo, "127.0.0.1", 0, protocol=protocol) as server:
        client = await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol))
        reader, writer = await wait(client.open_channel("x"))
        await roundtrip(reader, writer, b"x")
    await wait(client.wait_closed())
    assert client.is_closed
    with pytest.raises(polymux.SessionClosed):
        await wait(reader.read())


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_session_handler_receives_each_session(serve: Serve, protocol: str) -> None:
    seen: list[polymux.Session] = []

    async def greet(session: polymux.Session) -> None:
        seen.append(session)
        _reader, writer = await session.open_channel("greeting")
        writer.write(f"you are #{len(seen)}".encode())
        writer.write_eof()

    server = await serve(protocol=protocol, session_handler=greet)
    async with (
        await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as one,
        await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as two,
    ):
        greetings = set()
        for client in (one, two):
            reader, writer = await wait(client.accept_channel("greeting"))
            greetings.add(await wait(reader.read()))
            writer.close()
        assert greetings == {b"you are #1", b"you are #2"}
        assert len(seen) == 2
        assert seen[0] is not seen[1]
        assert set(seen) == server.sessions
        assert all(isinstance(s, polymux.Session) and s.protocol == protocol for s in seen)


# -- incoming channels ----------------------------------------------------------------------------


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_async_for_yields_incoming_channels_in_order_until_the_session_closes(
    serve: Serve, protocol: str
) -> None:
    names = ["c0", "c1", "c2", "c3"]

    async def offer_then_leave(session: polymux.Session) -> None:
        for name in names:
            await session.open_channel(name)
        await session.aclose()

    server = await serve(protocol=protocol, session_handler=offer_then_leave)
    client = await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol))
    try:
        got = []

        async def collect() -> None:
            async for reader, writer in client:
                assert isinstance(reader, asyncio.StreamReader)
                got.append(channel_name(writer))

        await wait(collect())  # returns: the iteration stopped when the session closed
        assert got == names
        assert client.is_closed
    finally:
        client.abort()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_async_for_stops_when_the_session_is_closed_locally(serve: Serve, protocol: str) -> None:
    server = await serve(protocol=protocol)
    client = await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol))
    try:
        got = []

        async def collect() -> None:
            async for _reader, writer in client:
                got.append(channel_name(writer))

        collecting = asyncio.create_task(collect())
        await wait(client.aclose())
        await wait(collecting)
        assert got == []
        assert client.exception is None
    finally:
        client.abort()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_accept_channel_by_name(serve: Serve, protocol: str) -> None:
    sessions: asyncio.Queue[polymux.Session] = asyncio.Queue()
    server = await serve(protocol=protocol, session_handler=sessions.put_nowait)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        peer = await wait(sessions.get())
        # Called before the offer arrives.
        early = asyncio.create_task(peer.accept_channel("wanted"))
        opened = {name: await wait(client.open_channel(name)) for name in ("first", "wanted", "second")}
        reader, writer = await wait(early)
        assert channel_name(writer) == "wanted"
        # Picks by name although "first" arrived earlier.
        reader2, writer2 = await wait(peer.accept_channel("second"))
        assert channel_name(writer2) == "second"
        reader1, writer1 = await wait(peer.accept_channel())
        assert channel_name(writer1) == "first"
        # Each accepted pair is wired to the channel of that name.
        for name, (peer_reader, peer_writer) in {
            "first": (reader1, writer1),
            "wanted": (reader, writer),
            "second": (reader2, writer2),
        }.items():
            opened[name][1].write(name.encode())
            assert await wait(peer_reader.readexactly(len(name))) == name.encode()
            peer_writer.write(b"<" + name.encode())
            assert await wait(opened[name][0].readexactly(len(name) + 1)) == b"<" + name.encode()


NAMES = ["", "plain", "données/été", "日本語のチャンネル", "emoji 🎉 \u0000 nul", "x" * 1000]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_channel_names_are_visible_on_both_sides(serve: Serve, protocol: str) -> None:
    sessions: asyncio.Queue[polymux.Session] = asyncio.Queue()
    server = await serve(protocol=protocol, session_handler=sessions.put_nowait)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        peer = await wait(sessions.get())
        for name in NAMES:
            _reader, writer = await wait(client.open_channel(name))
            assert channel_name(writer) == name
            assert writer.transport.name == name  # type: ignore[attr-defined]
            _peer_reader, peer_writer = await wait(peer.accept_channel())
            assert channel_name(peer_writer) == name


# -- plain protocols, half-close, close and reset -----------------------------------------------


class Recorder(asyncio.Protocol):
    """A plain protocol that records its callbacks."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.data = bytearray()
        self.transport: asyncio.BaseTransport | None = None
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.calls.append("made")
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert isinstance(data, bytes)
        self.calls.append("data")
        self.data += data

    def eof_received(self) -> bool | None:
        self.calls.append("eof")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.calls.append("lost")
        self.lost.set_result(exc)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_create_channel_with_a_plain_protocol(serve: Serve, echo: Handler, protocol: str) -> None:
    server = await serve(echo, protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        transport, proto = await wait(client.create_channel(Recorder, name="plain"))
        assert isinstance(proto, Recorder)
        assert isinstance(transport, ChannelTransport)
        assert proto.transport is transport
        assert transport.get_extra_info("channel_name") == "plain"
        payload = os.urandom(100_000)  # several frames, more than one ack batch
        transport.write(payload[:1])
        transport.writelines([payload[1:50_000], payload[50_000:]])
        transport.write_eof()
        assert await wait(proto.lost) is None
        assert bytes(proto.data) == payload
        assert proto.calls[0] == "made"
        assert proto.calls[-2:] == ["eof", "lost"]
        assert set(proto.calls[1:-2]) == {"data"}
        assert transport.is_closing()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_write_eof_half_close_keeps_the_other_direction(serve: Serve, protocol: str) -> None:
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.read()  # until the client's write_eof()
        writer.write(request.upper() + b"!")
        writer.write_eof()  # now the server half-closes; the client still writes
        got.set_result(await reader.read())

    server = await serve(handler, protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        reader, writer = await wait(client.open_channel("half"))
        assert writer.can_write_eof()
        writer.write(b"abc")
        writer.write_eof()
        with pytest.raises(polymux.ChannelClosedError) as info:
            writer.write(b"late")
        assert isinstance(info.value, BrokenPipeError)
        assert await wait(reader.read()) == b"ABC!"
        assert await wait(got) == b""

        # The other way round: the server ends first, the client keeps writing.
        got = asyncio.get_running_loop().create_future()

        async def ender(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"done talking")
            writer.write_eof()
            got.set_result(await reader.read())

        server2 = await serve(ender, protocol=protocol)
        async with await wait(polymux.connect("127.0.0.1", server2.port, protocol=protocol)) as client2:
            reader2, writer2 = await wait(client2.open_channel("half"))
            assert await wait(reader2.read()) == b"done talking"
            writer2.write(b"but I still am")
            await wait(writer2.drain())
            writer2.write_eof()
            assert await wait(got) == b"but I still am"


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_writer_close_and_wait_closed_complete(serve: Serve, protocol: str) -> None:
    server_done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        writer.close()
        await writer.wait_closed()
        server_done.set_result(data)

    server = await serve(handler, protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        _reader, writer = await wait(client.open_channel("bye"))
        writer.write(b"last words")
        writer.close()
        assert writer.is_closing()
        await wait(writer.wait_closed())
        assert await wait(server_done) == b"last words"
        # The session goes on.
        _other_reader, other_writer = await wait(client.open_channel("next"))
        other_writer.write(b"more")
        other_writer.write_eof()
        assert client.exception is None


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
@pytest.mark.parametrize(
    ("error", "text"),
    [("why", "why"), (ValueError("bad value"), "ValueError: bad value")],
    ids=["str", "exception"],
)
async def test_transport_reset_reaches_the_peer_reader(
    serve: Serve, protocol: str, error: str | BaseException, text: str
) -> None:
    caught: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()
        except (polymux.PolymuxError, ConnectionError) as exc:
            caught.set_result(exc)
        else:
            caught.set_exception(AssertionError("the reset arrived as a clean EOF"))

    server = await serve(handler, protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        _reader, writer = await wait(client.open_channel("doomed"))
        writer.write(b"partial")
        transport = cast(ChannelTransport, writer.transport)
        transport.reset(error)
        assert transport.is_closing()
        exc = await wait(caught)
        assert isinstance(exc, polymux.ChannelReset)
        assert isinstance(exc, ConnectionResetError)
        assert exc.format == protocol
        if protocol == "mstream-v1":
            assert exc.message is None  # v1 carries no error text
        else:
            assert exc.message == text
        assert client.exception is None


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_write_after_local_reset_is_refused(serve: Serve, echo: Handler, protocol: str) -> None:
    server = await serve(echo, protocol=protocol)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        _reader, writer = await wait(client.open_channel("doomed"))
        writer.transport.abort()
        with contextlib.suppress(polymux.ChannelError):
            writer.write(b"x" * 100_000)
        assert writer.transport.get_write_buffer_size() == 0
        with pytest.raises(polymux.ChannelClosedError):
            writer.write(b"after reset")


# -- graceful session close ------------------------------------------------------------------------


@pytest.mark.timeout(20)
@pytest.mark.parametrize("protocol", ALL)
async def test_aclose_flushes_what_was_written(serve: Serve, protocol: str) -> None:
    size = 1024 * 1024
    payload = os.urandom(size)
    received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.set_result(await reader.readexactly(size))

    server = await serve(handler, protocol=protocol)
    client = await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol))
    try:
        _reader, writer = await wait(client.open_channel("bulk"))
        writer.write(payload)
        await wait(client.aclose(), 15)
        assert client.is_closed
        data = await wait(received)
        assert hashlib.sha256(data).digest() == hashlib.sha256(payload).digest()
        with pytest.raises(polymux.SessionClosed):
            await wait(client.open_channel("after"))
        with pytest.raises(polymux.SessionClosed):
            await wait(client.accept_channel())
        await wait(client.aclose())  # idempotent
    finally:
        client.abort()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_data_finished_before_the_peer_closes_stays_readable(serve: Serve, protocol: str) -> None:
    async def say_bye_and_leave(session: polymux.Session) -> None:
        _reader, writer = await session.open_channel("bye")
        writer.write(b"bye")
        writer.write_eof()
        await session.aclose()

    server = await serve(protocol=protocol, session_handler=say_bye_and_leave)
    async with await wait(polymux.connect("127.0.0.1", server.port, protocol=protocol)) as client:
        reader, _writer = await wait(client.accept_channel("bye"))
        await wait(client.wait_closed())
        assert await wait(reader.read()) == b"bye"


# -- stream pairs and subprocesses -----------------------------------------------------------------

CHILD = r"""
import asyncio, sys
import polymux

async def echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()

async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    session = await polymux.over(reader, writer, protocol="mstream-v3", is_client=False, handler=echo)
    await session.wait_closed()

asyncio.run(main())
"""


@pytest.mark.timeout(30)
async def test_over_a_subprocess_stdio() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        session = await wait(polymux.over(proc.stdout, proc.stdin, protocol="mstream-v3"), 20)
        async with session:
            channels = [await wait(session.open_channel(f"echo/{i}"), 20) for i in range(3)]
            payloads = [os.urandom(300_000) for _ in channels]
            for (_, writer), payload in zip(channels, payloads, strict=True):
                writer.write(payload)
                writer.write_eof()
            for (reader, _), payload in zip(channels, payloads, strict=True):
                assert await wait(reader.read(), 20) == payload
        # Our end of the pipe closed: the child's session ends and it exits.
        assert await wait(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("protocol", ALL)
async def test_over_a_plain_asyncio_connection(echo: Handler, protocol: str) -> None:
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = loop.create_future()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result((reader, writer))

    raw_server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    async with raw_server:
        port = raw_server.sockets[0].getsockname()[1]
        client_reader, client_writer = await wait(asyncio.open_connection("127.0.0.1", port))
        server_reader, server_writer = await wait(accepted)
        # Both handshakes (v1/v2) must be under way before either side can be ready.
        a, b = await wait(
            asyncio.gather(
                polymux.over(client_reader, client_writer, protocol=protocol),
                polymux.over(server_reader, server_writer, protocol=protocol, is_client=False, handler=echo),
            )
        )
        async with a, b:
            reader, writer = await wait(a.open_channel("over"))
            await roundtrip(reader, writer, b"over a stream pair" * 1000)
            assert a.get_extra_info("peername") == client_writer.get_extra_info("peername")
        assert a.is_closed
        await wait(b.wait_closed())


# -- validation ------------------------------------------------------------------------------------


@pytest.mark.timeout(5)
async def test_unknown_session_option_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="bogus"):
        polymux.SessionConfig.from_options(bogus=1)
    # Refused before any connection is attempted (nothing listens on these).
    with pytest.raises(TypeError, match="bogus"):
        await wait(polymux.connect("127.0.0.1", 9, protocol="mstream-v2", bogus=1))
    with pytest.raises(TypeError, match="bogus"):
        await wait(polymux.connect_unix(tmp_path / "none.sock", protocol="mstream-v2", bogus=1))
    with pytest.raises(TypeError, match="bogus"):
        await wait(polymux.start_server(None, "127.0.0.1", 0, protocol="mstream-v2", bogus=1))
    with pytest.raises(TypeError, match="bogus"):
        await wait(polymux.start_unix_server(None, tmp_path / "s.sock", protocol="mstream-v2", bogus=1))
    assert not (tmp_path / "s.sock").exists()
    with pytest.raises(TypeError, match="bogus"):
        await wait(polymux.over(asyncio.StreamReader(), cast(Any, None), protocol="mstream-v2", bogus=1))


INVALID = [
    {"receive_window": 0},
    {"receive_window": -1},
    {"receive_window": 1.5},
    {"ack_min": 0},
    {"max_channels": 0},
    {"accept_backlog": -1},
    {"write_buffer_high": 0},
    {"write_buffer_low": -1},
    {"write_buffer_high": 1000, "write_buffer_low": 1001},
    {"stream_limit": 0},
    {"batch_bytes": 0},
    {"handshake_timeout": 0},
    {"close_timeout": -1.0},
]


@pytest.mark.timeout(5)
@pytest.mark.parametrize("options", INVALID, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
async def test_invalid_config_values_are_value_errors(options: dict[str, Any], tmp_path: Path) -> None:
    name = next(iter(options))
    with pytest.raises(ValueError, match=name):
        polymux.SessionConfig(**options)
    with pytest.raises(ValueError, match=name):
        await wait(polymux.connect("127.0.0.1", 9, protocol="mstream-v2", **options))
    with pytest.raises(ValueError, match=name):
        await wait(polymux.start_server(None, "127.0.0.1", 0, protocol="mstream-v2", **options))


@pytest.mark.timeout(5)
def test_valid_config_values() -> None:
    config = polymux.SessionConfig(
        receive_window=1, accept_backlog=0, write_buffer_high=8, write_buffer_low=8
    )
    assert config.low_water == 8
    assert polymux.SessionConfig(write_buffer_high=100).low_water == 25
    assert polymux.SessionConfig.from_options(config, max_channels=3).max_channels == 3


@pytest.mark.timeout(5)
async def test_unknown_protocol_over_a_stream_pair_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown protocol 'nope'.*mstream-v1"):
        await wait(polymux.over(asyncio.StreamReader(), cast(Any, None), protocol="nope"))
    with pytest.raises(ValueError):
        polymux.aio.MuxProtocol("mstream-v4")


@pytest.mark.timeout(5)
async def test_unknown_protocol_on_connect_is_a_value_error_before_connecting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown protocol"):
        await wait(polymux.connect_unix(tmp_path / "nobody-listens.sock", protocol="nope"))


@pytest.mark.timeout(5)
async def test_unknown_protocol_on_start_server_is_a_value_error() -> None:
    server = None
    try:
        with pytest.raises(ValueError, match="unknown protocol"):
            server = await wait(polymux.start_server(None, "127.0.0.1", 0, protocol="nope"))
    finally:
        if server is not None:
            server.close()
            await server.wait_closed()


# -- packaging and layering --------------------------------------------------------------------------

PACKAGE = Path(polymux.__file__).parent


@pytest.mark.timeout(5)
def test_package_is_typed() -> None:
    assert importlib.resources.files("polymux").joinpath("py.typed").is_file()
    pyproject = PACKAGE.parent.parent / "pyproject.toml"
    if pyproject.is_file():  # the source tree (editable install)
        config = tomllib.loads(pyproject.read_text())
        assert "py.typed" in config["tool"]["setuptools"]["package-data"]["polymux"]


FORBIDDEN = {"asyncio", "socket", "anyio", "pyspark", "uvloop"}


def forbidden_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` of every import of a FORBIDDEN module in ``tree``: ``import x``,
    ``from x import y``, ``__import__("x")`` and ``importlib.import_module("x")``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
            in {"__import__", "import_module"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        found.extend((node.lineno, name) for name in names if name.split(".")[0] in FORBIDDEN)
    return found


@pytest.mark.timeout(5)
def test_wire_and_engine_do_no_io() -> None:
    """Codecs and engines are sans-I/O: none of their modules imports an I/O framework."""
    modules = sorted([*(PACKAGE / "wire").rglob("*.py"), *(PACKAGE / "engine").rglob("*.py")])
    assert len(modules) >= 4
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in modules
        for line, name in forbidden_imports(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert not offenders, "sans-I/O layers import I/O modules:\n" + "\n".join(offenders)


@pytest.mark.timeout(5)
def test_layering_check_recognises_every_import_form() -> None:
    source = (
        "import asyncio\n"
        "from socket import socket\n"
        "import uvloop as u, os\n"
        "import pyspark.sql\n"
        "__import__('anyio')\n"
        "importlib.import_module('asyncio.streams')\n"
        "from . import asyncio_free\n"
        "import asynciox\n"
    )
    assert sorted(forbidden_imports(ast.parse(source))) == [
        (1, "asyncio"),
        (2, "socket"),
        (3, "uvloop"),
        (4, "pyspark.sql"),
        (5, "anyio"),
        (6, "asyncio.streams"),
    ]


@pytest.mark.parametrize("fmt", [f for f in formats.FORMATS if not f.caps.names], ids=lambda f: f.name)
async def test_formats_without_names_say_so(fmt: formats.Format) -> None:
    """yamux, smux and Streamux carry no channel names: the accepting side sees the stream
    id, and the documentation says so where a user looks (open_channel, the format's page;
    the getting-started example printed '1: CHANNEL 0' without a word)."""
    seen: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(writer.get_extra_info("channel_name"))
        writer.close()

    async with (
        await polymux.start_server(handler, "127.0.0.1", 0, protocol=fmt.name) as server,
        await polymux.connect("127.0.0.1", server.port, protocol=fmt.name) as session,
    ):
        reader, writer = await session.open_channel("files/1")
        writer.write(b"x")  # (an empty Streamux request is a ping, which no handler sees)
        writer.write_eof()
        await asyncio.wait_for(reader.read(), 10)
    assert seen and seen[0] != "files/1" and seen[0].isdigit()
    doc = polymux.Session.open_channel.__doc__ or ""
    assert fmt.family.split("-")[0] in doc.lower() or fmt.name.split("-")[0] in doc.lower()
    assert re.search(r"no (channel |stream )?names", _format_pages(fmt.name), re.IGNORECASE), fmt.name


def _format_pages(name: str) -> str:
    """The format's documentation page and the formats overview."""
    root = Path(__file__).resolve().parents[2] / "docs" / "formats"
    return (root / f"{name.split('-')[0]}.md").read_text() + (root / "index.md").read_text()
