"""TLS on every client and server entry point, with a self-signed certificate made by the
test (``openssl req -x509``), and the permissions of unix-socket servers."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
import stat
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import polymux


pytestmark = pytest.mark.timeout(60)

StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A fresh self-signed certificate for localhost / 127.0.0.1 and its key."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the TLS tests need the openssl command line tool (they are never skipped)")
    folder = tmp_path_factory.mktemp("tls")
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(keyfile),
            "-out",
            str(certfile),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return certfile, keyfile


@pytest.fixture
def server_ctx(cert: tuple[Path, Path]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*cert)
    return ctx


@pytest.fixture
def client_ctx(cert: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert[0]))


async def _roundtrip(session: polymux.Session, size: int = 200_000) -> None:
    """One echoed channel carrying ``size`` bytes, over a session that must be TLS."""
    assert session.get_extra_info("ssl_object") is not None, "the session is not on TLS"
    reader, writer = await session.open_pair("tls/echo")  # a channel each way on omnistreams
    data = os.urandom(size)

    async def send() -> None:
        writer.write(data)
        await writer.drain()
        writer.write_eof()

    sender = asyncio.ensure_future(send())
    got = await reader.read()
    await sender
    assert got == data
    writer.close()


@pytest.mark.parametrize("protocol", polymux.PROTOCOLS)
async def test_tcp_tls(
    protocol: str, echo: StreamHandler, server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> None:
    """``start_server(ssl=)`` and ``connect(ssl=)``: data crosses byte-exact, both ends
    see the TLS object."""
    async with asyncio.timeout(30):
        server = await polymux.start_server(echo, "127.0.0.1", 0, protocol=protocol, ssl=server_ctx)
        async with server:
            session = await polymux.connect(
                "127.0.0.1", server.port, protocol=protocol, ssl=client_ctx, server_hostname="localhost"
            )
            async with session:
                await _roundtrip(session)
                (server_session,) = server.sessions
                assert server_session.get_extra_info("ssl_object") is not None


@pytest.mark.parametrize("protocol", ["yamux", "mstream-v2"])
async def test_unix_tls(
    protocol: str,
    echo: StreamHandler,
    server_ctx: ssl.SSLContext,
    client_ctx: ssl.SSLContext,
    tmp_path: Path,
) -> None:
    """``start_unix_server(ssl=)`` and ``connect_unix(ssl=, server_hostname=)``."""
    path = tmp_path / "s"
    async with asyncio.timeout(30):
        server = await polymux.start_unix_server(echo, path, protocol=protocol, ssl=server_ctx)
        async with server:
            session = await polymux.connect_unix(
                path, protocol=protocol, ssl=client_ctx, server_hostname="localhost"
            )
            async with session:
                await _roundtrip(session)


async def test_untrusted_certificate_is_refused(echo: StreamHandler, server_ctx: ssl.SSLContext) -> None:
    """A client with the system trust store refuses the self-signed server, and the
    server is left with no session."""
    async with asyncio.timeout(30):
        server = await polymux.start_server(echo, "127.0.0.1", 0, protocol="yamux", ssl=server_ctx)
        async with server:
            with pytest.raises(ssl.SSLCertVerificationError):
                await polymux.connect(
                    "127.0.0.1", server.port, protocol="yamux", ssl=ssl.create_default_context()
                )
            assert not server.sessions  # the failed handshake left no session behind


async def test_plaintext_client_to_tls_server_fails(echo: StreamHandler, server_ctx: ssl.SSLContext) -> None:
    """A client speaking the format in clear to a TLS server gets an error, not a hang."""
    async with asyncio.timeout(30):
        server = await polymux.start_server(echo, "127.0.0.1", 0, protocol="mstream-v2", ssl=server_ctx)
        async with server:
            with pytest.raises((polymux.SessionClosed, ConnectionError)):
                await polymux.connect("127.0.0.1", server.port, protocol="mstream-v2", handshake_timeout=5)


async def test_websocket_tls(
    echo: StreamHandler, server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext
) -> None:
    """``serve_websocket(ssl=)`` and ``connect_websocket("wss://...", ssl=)`` (omnistreams)."""
    from polymux.aio.websocket import connect_websocket, serve_websocket

    async with asyncio.timeout(30):
        server = await serve_websocket(echo, "127.0.0.1", 0, ssl=server_ctx)
        async with server:
            port = server.sockets[0].getsockname()[1]
            session = await connect_websocket(f"wss://localhost:{port}/omnistreams", ssl=client_ctx)
            async with session:
                await _roundtrip(session, 100_000)


# -- unix socket permissions -----------------------------------------------------------


async def test_unix_server_socket_is_private_by_default(echo: StreamHandler, tmp_path: Path) -> None:
    path = tmp_path / "s"
    async with await polymux.start_unix_server(echo, path, protocol="mplex"):
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        session = await polymux.connect_unix(path, protocol="mplex")
        async with session:
            reader, writer = await session.open_channel("x")
            writer.write(b"ping")
            writer.write_eof()
            assert await reader.read() == b"ping"
            writer.close()


async def test_unix_server_mode_parameter(echo: StreamHandler, tmp_path: Path) -> None:
    path = tmp_path / "s"
    async with await polymux.start_unix_server(echo, path, protocol="yamux", mode=0o660):
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
    other = tmp_path / "u"
    old = os.umask(0o022)
    try:
        async with await polymux.start_unix_server(echo, other, protocol="yamux", mode=None):
            assert stat.S_IMODE(other.stat().st_mode) == 0o777 & ~0o022
    finally:
        os.umask(old)


async def test_unix_server_replaces_stale_socket_but_not_a_file(echo: StreamHandler, tmp_path: Path) -> None:
    stale = tmp_path / "stale"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(stale))
    sock.close()  # left behind, as by a crashed server
    async with await polymux.start_unix_server(echo, stale, protocol="yamux"):
        assert stat.S_IMODE(stale.stat().st_mode) == 0o600
    regular = tmp_path / "file"
    regular.write_bytes(b"keep me")
    with pytest.raises(OSError):
        await polymux.start_unix_server(echo, regular, protocol="yamux")
    assert regular.read_bytes() == b"keep me"
