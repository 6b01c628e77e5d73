"""polymux.anyio: ``AnyioSession`` over TCP on asyncio and trio, ``ChannelStream`` over an
asyncio session, interop between the two I/O layers, and unmodified anyio code (TLS) on
a channel.

How these tests are run (pytest-asyncio's auto mode versus anyio's pytest plugin)
---------------------------------------------------------------------------------
pyproject.toml sets ``asyncio_mode = "auto"``. In auto mode pytest-asyncio claims *every*
``async def`` test: it adds the ``asyncio`` mark itself and replaces the item with its own
``Coroutine`` item, whose ``runtest`` swaps the test function for a sync wrapper that runs
the coroutine on pytest-asyncio's asyncio runner. anyio's ``pytest_pyfunc_call`` then sees
a function that is not a coroutine function and steps aside, so a plain
``@pytest.mark.anyio async def test(...)`` gets both ids, ``[asyncio]`` and ``[trio]``, and
runs *both on asyncio* (``test_plain_anyio_tests_are_claimed_by_pytest_asyncio`` shows it).
No mark opts a test out of auto mode, and ``pytestmark = pytest.mark.anyio`` only adds
anyio's mark, so a module-level ``pytestmark`` cannot fix it.

So the tests are written ``async def`` as usual and decorated with :func:`anyio_test`,
which turns each into a plain (sync) test function taking the module's ``anyio_backend``
fixture and running the coroutine with ``anyio.run(..., backend=anyio_backend)`` under
``anyio.fail_after``. Neither plugin touches sync test functions, so the ``[trio]`` tests
really run under trio (``test_backends_really_run`` asserts it with sniffio). The module
keeps the ``anyio`` mark (``-m anyio`` selects these tests); with pytest-asyncio in strict
mode the decorator could be dropped and anyio's plugin would run the same tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import importlib.util
import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
import sniffio
from anyio.abc import ByteStream, SocketAttribute, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.tls import TLSAttribute, TLSStream

import polymux
from polymux.anyio import AnyioChannel, AnyioSession, ChannelAttribute, ChannelStream, session
from polymux.config import SessionConfig
from polymux.engine import Engine, events as ev
from polymux.formats import make_engine
from polymux.wire import mstream as mstream_wire, yamux as yamux_wire


pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

TEST_TIMEOUT = 30.0
"""Seconds any one test may take (``anyio.fail_after`` inside the test's event loop)."""

FLOW_CONTROLLED = ["mstream-v3", "yamux"]

E = TypeVar("E", bound=ev.Event)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """The anyio backend a test runs on (see the module docstring)."""
    return str(request.param)


asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])
"""For tests of the asyncio I/O layer (``polymux.Session``), which needs an asyncio loop."""


def anyio_test(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run ``async def test(anyio_backend, ...)`` on ``anyio_backend``, bounded in time."""

    @functools.wraps(test)  # pytest reads the fixtures from the wrapped signature
    def run(anyio_backend: str, **fixtures: Any) -> None:
        async def bounded() -> None:
            with anyio.fail_after(TEST_TIMEOUT):
                await test(anyio_backend=anyio_backend, **fixtures)

        anyio.run(bounded, backend=anyio_backend)

    return run


# -- helpers ------------------------------------------------------------------------------------


@asynccontextmanager
async def tcp_streams() -> AsyncIterator[tuple[SocketStream, SocketStream]]:
    """A connected pair of TCP streams on 127.0.0.1: ``(client end, server end)``."""
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(SocketAttribute.local_port)
        client = await anyio.connect_tcp("127.0.0.1", port)
        server = await listener.listeners[0].accept()  # one listener: 127.0.0.1 only
    async with client, server:
        yield client, server


@asynccontextmanager
async def session_pair(protocol: str, **options: Any) -> AsyncIterator[tuple[AnyioSession, AnyioSession]]:
    """Two AnyioSessions over TCP: ``(client, server)``."""
    async with (
        tcp_streams() as (client_end, server_end),
        session(server_end, protocol=protocol, is_client=False, **options) as server,
        session(client_end, protocol=protocol, **options) as client,
    ):
        yield client, server


async def receive_all(stream: ByteStream) -> bytes:
    """Everything until the peer's end of writing (``EndOfStream``)."""
    data = bytearray()
    async for chunk in stream:
        data += chunk
    return bytes(data)


async def echo(stream: ByteStream) -> None:
    """Echo until the peer's end of writing, then end ours."""
    async for chunk in stream:
        await stream.send(chunk)
    await stream.send_eof()


async def exchange(stream: ByteStream, payload: bytes) -> bytes:
    """Send ``payload`` and end writing while receiving everything the peer sends."""
    received = b""

    async def read() -> None:
        nonlocal received
        received = await receive_all(stream)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await stream.send(payload)
        await stream.send_eof()
    return received


class EnginePeer:
    """A bare sans-I/O engine on the server end of a TCP connection, driven by the test.

    It does on the wire what an AnyioSession peer has no public method for (resetting a
    channel, a go-away, ContentReadingCompleted), with polymux's own engine and codecs.
    """

    def __init__(self, stream: SocketStream, protocol: str, **options: Any) -> None:
        self.stream = stream
        self.engine: Engine = make_engine(
            protocol, SessionConfig.from_options(None, **options), is_client=False
        )
        self._events: list[ev.Event] = []

    async def flush(self) -> None:
        if out := self.engine.data_to_send():
            await self.stream.send(b"".join(out))

    async def next_event(self, kind: type[E]) -> E:
        """Read until the engine reports an event of ``kind`` (others are dropped)."""
        while True:
            while self._events:
                event = self._events.pop(0)
                if isinstance(event, kind):
                    return event
            self._events += self.engine.receive_data(await self.stream.receive())
            await self.flush()

    async def accept(self) -> int:
        """Accept the next channel the client opens; return its engine handle."""
        opened = await self.next_event(ev.ChannelOpened)
        self.engine.accept_channel(opened.channel)
        await self.flush()
        return opened.channel


@asynccontextmanager
async def client_and_peer(protocol: str) -> AsyncIterator[tuple[AnyioSession, EnginePeer]]:
    """An AnyioSession client whose server is an :class:`EnginePeer`."""
    async with tcp_streams() as (client_end, server_end), session(client_end, protocol=protocol) as client:
        yield client, EnginePeer(server_end, protocol)


async def open_with_peer(client: AnyioSession, peer: EnginePeer, name: str) -> tuple[AnyioChannel, int]:
    """Open a channel that ``peer`` accepts: ``(our channel, the peer's handle)``."""
    handle = 0

    async def accept() -> None:
        nonlocal handle
        handle = await peer.accept()

    async with anyio.create_task_group() as tg:
        tg.start_soon(accept)
        channel = await client.open_channel(name)
    return channel, handle


class Pending:
    """Runs one call in the background and records its outcome (for calls that block)."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: BaseException | None = None

    async def run(self, call: Callable[[], Awaitable[object]]) -> None:
        try:
            await call()
        except Exception as exc:  # noqa: BLE001 - recorded for the test to check
            self.error = exc
        finally:
            self.done.set()

    async def finished_within(self, seconds: float) -> bool:
        with anyio.move_on_after(seconds):
            await self.done.wait()
        return self.done.is_set()


# -- the two plugins ----------------------------------------------------------------------------


@anyio_test
async def test_backends_really_run(anyio_backend: str) -> None:
    assert sniffio.current_async_library() == anyio_backend
    if anyio_backend == "trio":
        with pytest.raises(RuntimeError):
            asyncio.get_running_loop()  # no asyncio loop anywhere near a trio test


PROBE = """
import pytest
import sniffio

@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param

@pytest.mark.anyio
async def test_probe(anyio_backend):
    print(f"PROBE wanted={anyio_backend} ran={sniffio.current_async_library()}")
"""


def test_plain_anyio_tests_are_claimed_by_pytest_asyncio(tmp_path: Path) -> None:
    """Why :func:`anyio_test` exists: with ``asyncio_mode = auto``, a plain anyio test's
    ``[trio]`` variant runs on asyncio. If this starts failing, pytest-asyncio stopped
    claiming anyio tests and the decorator can go."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(PROBE))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PROBE wanted=asyncio ran=asyncio" in result.stdout
    assert "PROBE wanted=trio ran=asyncio" in result.stdout, result.stdout


# -- AnyioSession over TCP -----------------------------------------------------------------------

NAMES_ON_THE_WIRE = {"mstream-v1", "mstream-v2", "mstream-v3", "mplex", "multiplex"}
"""Formats whose offers carry the channel's name (yamux and Streamux name a channel by id)."""


TWO_WAY = [p for p in polymux.PROTOCOLS if not getattr(make_engine(p), "one_way", False)]
"""Formats whose channels carry data both ways (omnistreams streams are one-way: no echo)."""


@pytest.mark.parametrize("protocol", TWO_WAY)
@anyio_test
async def test_echo_8_channels_of_1_mib(anyio_backend: str, protocol: str) -> None:
    payloads = {f"echo/{i}": os.urandom(1 << 20) for i in range(8)}
    async with session_pair(protocol) as (client, server):

        async def serve() -> None:
            async with anyio.create_task_group() as tg:
                for _ in payloads:
                    channel = await server.accept_channel()
                    name = channel.extra(ChannelAttribute.name)
                    if protocol in NAMES_ON_THE_WIRE:
                        assert name in payloads
                    assert f"(remote, {name!r})" in channel.extra(ChannelAttribute.channel)
                    assert channel.extra(ChannelAttribute.protocol) == protocol
                    tg.start_soon(echo, channel)

        async def one(name: str) -> None:
            channel = await client.open_channel(name)
            assert isinstance(channel, ByteStream)
            assert channel.extra(ChannelAttribute.name) == name
            assert channel.extra(ChannelAttribute.channel).endswith(f"(local, {name!r})")
            assert channel.extra(ChannelAttribute.protocol) == protocol == client.protocol
            assert await exchange(channel, payloads[name]) == payloads[name]  # all at full speed
            for _ in range(2):  # the peer's end, and it stands
                with pytest.raises(anyio.EndOfStream):
                    await channel.receive()
            await channel.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            for name in payloads:
                tg.start_soon(one, name)


@pytest.mark.parametrize("protocol", FLOW_CONTROLLED)
@anyio_test
async def test_send_waits_for_the_peers_window(anyio_backend: str, protocol: str) -> None:
    # mstream-v3 advertises receive_window; yamux streams start with a fixed 256 KiB.
    window = 64 * 1024 if protocol == "mstream-v3" else yamux_wire.INITIAL_WINDOW
    # yamux refuses receive_window (its windows are its own): only mstream-v3 is given one.
    options = {"receive_window": 64 * 1024} if protocol == "mstream-v3" else {}
    async with session_pair(protocol, **options) as (client, server):
        channel = await client.open_channel("slow")
        reader = await server.accept_channel()
        await channel.send(b"w" * window)  # the whole window goes out with nobody reading

        sending = Pending()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sending.run, lambda: channel.send(b"x" * 1000))
            with anyio.move_on_after(0.5) as waited:
                await sending.done.wait()
            assert waited.cancelled_caught, "send() completed although the peer's window was full"

            received = await BufferedByteReceiveStream(reader).receive_exactly(window + 1000)
            assert received == b"w" * window + b"x" * 1000
            assert await sending.finished_within(5), "send() still waits after the reader caught up"
        assert sending.error is None


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", FLOW_CONTROLLED)
@anyio_test
async def test_peer_reset_breaks_the_channel(anyio_backend: str, protocol: str) -> None:
    async with client_and_peer(protocol) as (client, peer):
        channel, handle = await open_with_peer(client, peer, "doomed")
        receiving = Pending()
        async with anyio.create_task_group() as tg:
            tg.start_soon(receiving.run, channel.receive)
            await anyio.sleep(0.05)
            peer.engine.reset_channel(handle, "boom")
            await peer.flush()
            assert await receiving.finished_within(5)

        assert isinstance(receiving.error, anyio.BrokenResourceError)
        reset = receiving.error.__cause__
        assert isinstance(reset, polymux.ChannelReset)
        assert reset.message == ("boom" if protocol == "mstream-v3" else None)  # yamux has no text
        with pytest.raises(anyio.BrokenResourceError) as sent:
            await channel.send(b"late")
        assert isinstance(sent.value.__cause__, polymux.ChannelReset)
        await channel.aclose()  # still fine


@anyio_test
async def test_use_after_aclose_is_closed_resource_error(anyio_backend: str) -> None:
    async with session_pair("yamux") as (client, server):
        channel = await client.open_channel("short")
        await server.accept_channel()
        await channel.aclose()
        await channel.aclose()  # idempotent
        with pytest.raises(anyio.ClosedResourceError):
            await channel.send(b"x")
        with pytest.raises(anyio.ClosedResourceError):
            await channel.receive()

        other = await client.open_channel("half")
        await other.send_eof()
        with pytest.raises(anyio.ClosedResourceError):
            await other.send(b"after send_eof")


@pytest.mark.parametrize("protocol", FLOW_CONTROLLED)
@anyio_test
async def test_peer_connection_lost_fails_pending_calls(anyio_backend: str, protocol: str) -> None:
    async with client_and_peer(protocol) as (client, peer):
        reading, _ = await open_with_peer(client, peer, "reading")
        writing, _ = await open_with_peer(client, peer, "writing")
        receiving, sending = Pending(), Pending()
        async with anyio.create_task_group() as tg:
            tg.start_soon(receiving.run, reading.receive)
            tg.start_soon(sending.run, lambda: writing.send(b"z" * (8 << 20)))  # beyond any window
            await anyio.sleep(0.2)
            assert not receiving.done.is_set() and not sending.done.is_set()
            await peer.stream.aclose()
            assert await receiving.finished_within(5) and await sending.finished_within(5)

        for pending in (receiving, sending):  # never a silent EOF
            assert isinstance(pending.error, anyio.BrokenResourceError), pending.error
            assert isinstance(pending.error.__cause__, polymux.SessionClosed)
        with pytest.raises(polymux.SessionClosed):
            await client.accept_channel()
        with pytest.raises(polymux.SessionClosed):
            await client.open_channel("too late")


@pytest.mark.parametrize("protocol", FLOW_CONTROLLED)
@anyio_test
async def test_peer_closing_the_connection_cleanly_is_no_silent_eof(
    anyio_backend: str, protocol: str
) -> None:
    async with client_and_peer(protocol) as (client, peer):
        channel, _ = await open_with_peer(client, peer, "waiting")
        receiving = Pending()
        async with anyio.create_task_group() as tg:
            tg.start_soon(receiving.run, channel.receive)
            await anyio.sleep(0.05)
            await peer.stream.aclose()  # a FIN, nothing unread: the peer just went away
            assert await receiving.finished_within(5)
        assert isinstance(receiving.error, anyio.BrokenResourceError)
        assert isinstance(receiving.error.__cause__, polymux.SessionClosed)
        assert client.error is None  # an orderly end of the connection, but not of the channel


@anyio_test
async def test_closing_our_own_stream_fails_pending_receive(anyio_backend: str) -> None:
    async with tcp_streams() as (client_end, _server_end), session(client_end, protocol="yamux") as client:
        channel = await client.open_channel("x")  # yamux: usable at once, no answer needed
        receiving = Pending()
        async with anyio.create_task_group() as tg:
            tg.start_soon(receiving.run, channel.receive)
            await anyio.sleep(0.05)
            await client_end.aclose()
            assert await receiving.finished_within(5)
        assert isinstance(receiving.error, anyio.BrokenResourceError)
        closed = receiving.error.__cause__
        assert isinstance(closed, polymux.SessionClosed)
        assert isinstance(closed.__cause__, anyio.ClosedResourceError)
        assert client.error is closed.__cause__


@pytest.mark.parametrize("protocol", FLOW_CONTROLLED)
@anyio_test
async def test_connection_lost_after_the_peers_end_is_end_of_stream(
    anyio_backend: str, protocol: str
) -> None:
    async with client_and_peer(protocol) as (client, peer):
        channel, handle = await open_with_peer(client, peer, "answered")
        peer.engine.send_data(handle, b"the whole answer")
        peer.engine.end_channel(handle)
        await peer.flush()
        await anyio.sleep(0.1)
        await peer.stream.aclose()
        await client.wait_closed()

        assert await receive_all(channel) == b"the whole answer"  # then EndOfStream, not an error
        with pytest.raises(anyio.EndOfStream):
            await channel.receive()
        with pytest.raises(anyio.BrokenResourceError) as sent:  # writing did fail
            await channel.send(b"reply")
        assert isinstance(sent.value.__cause__, polymux.SessionClosed)


# -- interop between the asyncio and the anyio I/O layers ----------------------------------------


async def asyncio_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo a channel of a polymux asyncio session; a first chunk b"reset me" resets it."""
    with contextlib.suppress(ConnectionError):  # the session may end under it
        data = await reader.read(65536)
        if data == b"reset me":
            writer.transport.reset("boom")
            return
        while data:
            writer.write(data)
            await writer.drain()
            data = await reader.read(65536)
        writer.close()


@asyncio_only
@pytest.mark.parametrize("protocol", FLOW_CONTROLLED)
@anyio_test
async def test_anyio_client_asyncio_server(anyio_backend: str, protocol: str) -> None:
    payloads = {f"a2s/{i}": os.urandom(300_000) for i in range(4)}
    names: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        names.append(writer.transport.get_extra_info("channel_name"))
        await asyncio_echo(reader, writer)

    async with await polymux.start_server(handler, "127.0.0.1", 0, protocol=protocol) as server:
        stream = await anyio.connect_tcp("127.0.0.1", server.port)
        async with session(stream, protocol=protocol) as client:

            async def one(name: str) -> None:
                channel = await client.open_channel(name)
                assert await exchange(channel, payloads[name]) == payloads[name]
                await channel.aclose()

            async with anyio.create_task_group() as tg:
                for name in payloads:
                    tg.start_soon(one, name)
    if protocol == "mstream-v3":
        assert sorted(names) == sorted(payloads)


@asyncio_only
@pytest.mark.parametrize("protocol", FLOW_CONTROLLED)
@anyio_test
async def test_asyncio_client_anyio_server(anyio_backend: str, protocol: str) -> None:
    payloads = {f"s2a/{i}": os.urandom(300_000) for i in range(4)}
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(SocketAttribute.local_port)
        polymux_client = await polymux.connect("127.0.0.1", port, protocol=protocol)
        server_end = await listener.listeners[0].accept()
    async with (
        polymux_client,
        session(server_end, protocol=protocol, is_client=False) as server,
        anyio.create_task_group() as tg,
    ):

        async def serve() -> None:
            async for channel in server:
                tg.start_soon(echo, channel)

        async def one(name: str) -> None:
            reader, writer = await polymux_client.open_channel(name)
            writer.write(payloads[name])
            writer.write_eof()
            assert await reader.read() == payloads[name]
            writer.close()

        tg.start_soon(serve)
        async with anyio.create_task_group() as clients:
            for name in payloads:
                clients.start_soon(one, name)
        tg.cancel_scope.cancel()


# -- ChannelStream: an asyncio session's channel as an anyio ByteStream --------------------------


@asynccontextmanager
async def asyncio_session(protocol: str) -> AsyncIterator[polymux.Session]:
    async with (
        await polymux.start_server(asyncio_echo, "127.0.0.1", 0, protocol=protocol) as server,
        await polymux.connect("127.0.0.1", server.port, protocol=protocol) as client,
    ):
        yield client


@asyncio_only
@pytest.mark.parametrize("protocol", FLOW_CONTROLLED)
@anyio_test
async def test_channel_stream_echo(anyio_backend: str, protocol: str) -> None:
    payload = os.urandom(1 << 20)
    async with asyncio_session(protocol) as client:
        stream = ChannelStream(*await client.open_channel("files/1"))
        assert stream.extra(ChannelAttribute.name) == "files/1"
        assert stream.extra(ChannelAttribute.channel).endswith("(local, 'files/1')")
        assert stream.extra(ChannelAttribute.protocol) == protocol
        assert await exchange(stream, payload) == payload
        with pytest.raises(anyio.EndOfStream):
            await stream.receive()

        # Unmodified anyio code on it: a buffered reader.
        second = ChannelStream(*await client.open_channel("files/2"))
        await second.send(b"header\r\nbody")
        buffered = BufferedByteReceiveStream(second)
        assert await buffered.receive_until(b"\r\n", 100) == b"header"
        assert await buffered.receive_exactly(4) == b"body"

        for done in (stream, second):
            await done.aclose()
            await done.aclose()
            with pytest.raises(anyio.ClosedResourceError):
                await done.send(b"x")
            with pytest.raises(anyio.ClosedResourceError):
                await done.receive()


@asyncio_only
@pytest.mark.parametrize("protocol", FLOW_CONTROLLED)
@anyio_test
async def test_channel_stream_peer_reset(anyio_backend: str, protocol: str) -> None:
    async with asyncio_session(protocol) as client:
        stream = ChannelStream(*await client.open_channel("reset"))
        await stream.send(b"reset me")
        with pytest.raises(anyio.BrokenResourceError) as received:
            await stream.receive()
        assert isinstance(received.value.__cause__, polymux.ChannelReset)
        with pytest.raises(anyio.BrokenResourceError) as sent:
            await stream.send(b"late")
        assert isinstance(sent.value.__cause__, polymux.ChannelReset)
        await stream.aclose()


# -- unmodified anyio code on a channel: TLS -----------------------------------------------------


def self_signed_with_cryptography(cert: Path, key: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(private.public_key()), critical=False)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


OPENSSL_REQ = (
    "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1"
    " -subj /CN=localhost -addext subjectAltName=DNS:localhost"
)


def self_signed_with_openssl(openssl: str, cert: Path, key: Path) -> None:
    command = [openssl, *OPENSSL_REQ.split(), "-keyout", str(key), "-out", str(cert)]
    subprocess.run(command, check=True, capture_output=True, timeout=30)


@pytest.fixture
def tls_contexts(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """``(server context, client context)`` for a fresh self-signed "localhost" certificate:
    made with trustme if installed, else cryptography, else the openssl command."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if importlib.util.find_spec("trustme") is not None:
        import trustme

        ca = trustme.CA()
        ca.issue_cert("localhost").configure_cert(server)
        ca.configure_trust(client)
        return server, client
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    if importlib.util.find_spec("cryptography") is not None:
        self_signed_with_cryptography(cert, key)
    elif openssl := shutil.which("openssl"):
        self_signed_with_openssl(openssl, cert, key)
    else:
        pytest.skip("no trustme, no cryptography and no openssl command to make a certificate")
    server.load_cert_chain(cert, key)
    client.load_verify_locations(cert)
    return server, client


@anyio_test
async def test_tls_in_one_channel_plain_data_in_another(
    anyio_backend: str, tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    server_context, client_context = tls_contexts
    secret = os.urandom(600_000)  # more than a yamux window: TLS records under flow control
    plain = b"plain bytes next door " * 20_000

    async with session_pair("yamux") as (client, server):

        async def serve_tls(channel: AnyioChannel) -> None:
            tls = await TLSStream.wrap(channel, server_side=True, ssl_context=server_context)
            assert tls.extra(TLSAttribute.server_side) is True
            assert tls.extra(ChannelAttribute.protocol) == "yamux"  # the channel's attributes show
            data = await BufferedByteReceiveStream(tls).receive_exactly(len(secret))
            await tls.send(data[::-1])
            await tls.aclose()  # close_notify, then the channel's end

        async def serve() -> None:
            async with anyio.create_task_group() as tg:
                for handler in (serve_tls, echo):  # the order the client opens them in
                    tg.start_soon(handler, await server.accept_channel())

        async def talk_tls(channel: AnyioChannel) -> None:
            tls = await TLSStream.wrap(channel, hostname="localhost", ssl_context=client_context)
            assert tls.extra(TLSAttribute.tls_version).startswith("TLS")
            assert tls.extra(TLSAttribute.peer_certificate)["subject"] == ((("commonName", "localhost"),),)
            assert tls.extra(ChannelAttribute.name) == "tls"
            await tls.send(secret)
            assert await receive_all(tls) == secret[::-1]  # EndOfStream at the close_notify
            await tls.aclose()

        async def talk_plain(channel: AnyioChannel) -> None:
            assert await exchange(channel, plain) == plain
            await channel.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            tls_channel = await client.open_channel("tls")
            plain_channel = await client.open_channel("plain")
            tg.start_soon(talk_tls, tls_channel)
            tg.start_soon(talk_plain, plain_channel)


# -- regressions: behaviours the anyio layer once got wrong -----------------------------------


@pytest.mark.parametrize("protocol", FLOW_CONTROLLED)
@anyio_test
async def test_aclose_gives_back_the_window_of_unread_data(anyio_backend: str, protocol: str) -> None:
    """Closing a channel drops what it holds unread and returns that window, so the peer's
    blocked send() completes (its data is discarded), as with the asyncio layer's close()."""
    window = 64 * 1024 if protocol == "mstream-v3" else yamux_wire.INITIAL_WINDOW
    # yamux refuses receive_window (its windows are its own): only mstream-v3 is given one.
    options = {"receive_window": 64 * 1024} if protocol == "mstream-v3" else {}
    async with session_pair(protocol, **options) as (client, server):
        channel = await client.open_channel("ignored")
        unread = await server.accept_channel()
        sending = Pending()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sending.run, lambda: channel.send(b"u" * (window * 3)))
            await anyio.sleep(0.3)  # the window is in the reader's buffer, unread
            await unread.aclose()
            finished = await sending.finished_within(2)
            tg.cancel_scope.cancel()
        assert finished, "the peer's send() still waits for credit after we closed the channel"


@anyio_test
async def test_receive_after_aclose_with_buffered_data(anyio_backend: str) -> None:
    """After aclose(), receive() is ClosedResourceError even with data still buffered."""
    async with session_pair("yamux") as (client, server):
        channel = await client.open_channel("x")
        await channel.send(b"unread")
        accepted = await server.accept_channel()
        await anyio.sleep(0.1)  # "unread" is in the buffer
        await accepted.aclose()
        with pytest.raises(anyio.ClosedResourceError):
            await accepted.receive()


@anyio_test
async def test_send_after_the_peer_terminated_the_channel(anyio_backend: str) -> None:
    """mstream: the peer ended writing, then terminated the channel (no error text): reading
    ends with EndOfStream, and send() fails at once instead of waiting for credit forever."""
    async with client_and_peer("mstream-v3") as (client, peer):
        channel, handle = await open_with_peer(client, peer, "terminated")
        peer.engine.end_channel(handle)
        peer.engine.reset_channel(handle)  # ChannelTerminated without an error message
        await peer.flush()
        with pytest.raises(anyio.EndOfStream):
            await channel.receive()
        sending = Pending()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sending.run, lambda: channel.send(b"anyone there?"))
            finished = await sending.finished_within(1)
            tg.cancel_scope.cancel()
        assert finished, "send() hangs on a channel the peer terminated"
        assert isinstance(sending.error, anyio.BrokenResourceError)
        assert isinstance(sending.error.__cause__, polymux.ChannelClosedError)


@anyio_test
async def test_send_after_the_peer_stopped_reading(anyio_backend: str) -> None:
    """mstream ContentReadingCompleted: send() fails instead of waiting for credit forever."""
    async with client_and_peer("mstream-v3") as (client, peer):
        channel, _ = await open_with_peer(client, peer, "unwanted")
        wire_id = int(channel.extra(ChannelAttribute.channel).split()[1])  # "channel 1 (local, ...)"
        stop = mstream_wire.Frame(
            mstream_wire.ControlCode.CONTENT_READING_COMPLETED, wire_id, b"", source=-1
        )  # the source as the sender sees it: the channel is the client's (remote to the peer)
        await peer.stream.send(mstream_wire.encode_frame(3, stop))
        await anyio.sleep(0.1)
        sending = Pending()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sending.run, lambda: channel.send(b"nobody reads this"))
            finished = await sending.finished_within(1)
            tg.cancel_scope.cancel()
        assert finished, "send() hangs on a channel the peer stopped reading"
        assert isinstance(sending.error, anyio.BrokenResourceError)
        assert isinstance(sending.error.__cause__, polymux.ChannelClosedError)


@anyio_test
async def test_goaway_with_an_error_ends_the_session(anyio_backend: str) -> None:
    """A yamux GoAway with an error code ends the session: pending receives fail."""
    async with client_and_peer("yamux") as (client, peer):
        channel, _ = await open_with_peer(client, peer, "x")
        receiving = Pending()
        async with anyio.create_task_group() as tg:
            tg.start_soon(receiving.run, channel.receive)
            await peer.stream.send(yamux_wire.encode_header(yamux_wire.Type.GO_AWAY, 0, 0, 2))
            finished = await receiving.finished_within(1)  # code 2: internal error
            tg.cancel_scope.cancel()
        assert finished, "receive() still waits after the peer's GoAway(internal error)"
        assert isinstance(receiving.error, anyio.BrokenResourceError)
        assert isinstance(receiving.error.__cause__, polymux.SessionClosed)


@anyio_test
async def test_open_after_goaway_is_session_closed(anyio_backend: str) -> None:
    """After the peer's GoAway(normal), open_channel() is SessionClosed (not LimitExceeded);
    channels already open go on."""
    async with client_and_peer("yamux") as (client, peer):
        before, handle = await open_with_peer(client, peer, "before")
        await peer.stream.send(yamux_wire.encode_header(yamux_wire.Type.GO_AWAY, 0, 0, 0))
        await anyio.sleep(0.1)
        with pytest.raises(polymux.SessionClosed):
            await client.open_channel("after")
        await before.send(b"still open")
        peer.engine.send_data(handle, b"and answered")
        await peer.flush()
        assert await before.receive() == b"and answered"


async def open_and_close_a_session_pair() -> None:
    async with session_pair("yamux") as (client, server):
        channel = await client.open_channel("x")
        await server.accept_channel()
        await channel.aclose()


@anyio_test
async def test_a_finished_session_leaves_nothing_unclosed(anyio_backend: str) -> None:
    """No "Unclosed <MemoryObjectReceiveStream>" ResourceWarning once a session is collected."""
    gc.collect()  # what earlier tests left behind is not this test's business
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        await open_and_close_a_session_pair()
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


# -- regression: reading never waits for writing ----------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "window"), [("mstream-v3", 4 << 20), ("mplex", 64 << 10)], ids=["mstream-v3", "mplex"]
)
@anyio_test
async def test_bulk_echo_keeps_moving(anyio_backend: str, protocol: str, window: int) -> None:
    """16 channels echo 4 MiB each, far more in flight both ways than the socket buffers
    hold. When the session's reading loop (and receive()) awaited socket sends, both sides
    ended up waiting to write with nobody reading: a deadlock within the first 300 KB, on
    both backends. A stall of one second fails the test instead of hanging it."""
    count, size = 16, 4 << 20
    received = 0
    stalled_at: int | None = None
    async with (
        tcp_streams() as (client_end, server_end),
        session(server_end, protocol=protocol, is_client=False, receive_window=window) as server,
        session(client_end, protocol=protocol, receive_window=window) as client,
    ):

        async def serve() -> None:
            async with anyio.create_task_group() as tg:
                for _ in range(count):
                    tg.start_soon(echo, await server.accept_channel())

        async def one(i: int) -> None:
            channel = await client.open_channel(f"bulk/{i}")

            async def read() -> None:
                nonlocal received
                async for chunk in channel:
                    received += len(chunk)

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await channel.send(os.urandom(size))
                await channel.send_eof()

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            for i in range(count):
                tg.start_soon(one, i)
            last = -1
            while received < count * size:
                await anyio.sleep(1)
                if received == last:  # no byte moved for a second
                    stalled_at = received
                    tg.cancel_scope.cancel()
                    break
                last = received
        # After a stall, unblock the sessions' shielded goodbyes: their peers read nothing.
        await anyio.aclose_forcefully(client_end)
        await anyio.aclose_forcefully(server_end)
    assert stalled_at is None, f"deadlock: stuck at {stalled_at} of {count * size} bytes"


# -- regression: closing is bounded when the peer does not read -------------------------------


@anyio_test
async def test_aclose_is_bounded_by_close_timeout_when_the_peer_does_not_read(anyio_backend: str) -> None:
    """The peer never reads (a plain socket: an anyio stream on asyncio would buffer for it):
    the writer task waits in send() with the socket full, holding the output. aclose() gives
    its goodbye close_timeout, then cuts the connection (it used to wait, shielded, for ever:
    the driver suite's mplex flood test hung 1 run in 4)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        ours = await anyio.connect_tcp("127.0.0.1", listener.getsockname()[1])
        peer, _ = listener.accept()  # queued already: returns at once; never read
        with peer:
            async with session(ours, protocol="mplex", close_timeout=0.5) as s:
                channel = await s.open_channel("flood")
                with anyio.move_on_after(1.0):
                    while True:  # until the socket, then the channel's buffer, are full
                        await channel.send(bytes(64 * 1024))
                assert s._send_lock.locked()  # the writer task waits in send()
                start = anyio.current_time()
            assert anyio.current_time() - start < 5.0
