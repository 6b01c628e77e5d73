"""polymux.sniff: the non-multiplexing protocols a wrong peer usually speaks (HTTP, TLS, SSH)
are recognised from their first bytes, and the first bytes of every polymux format, each
way, are never taken for one of them."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pytest

import polymux
from polymux._types import BytesLike
from polymux.sniff import identify, show


HTML_PAGE = 'an HTML page, "<!DOCTYPE HTML>" (an HTTP server\'s answer without a status line, as to HTTP/0.9)'


@pytest.mark.parametrize(
    ("data", "name", "what", "peer"),
    [
        (b"HTTP/1.1 400 Bad Request\r\nServer: nginx\r\n\r\n", "HTTP", 'an HTTP response "HTTP/1.1 400 Bad Request"',
         "an HTTP server"),
        (b"HTTP/1.0 414 Request-URI Too Long\r\n", "HTTP", 'an HTTP response "HTTP/1.0 414 Request-URI Too Long"',
         "an HTTP server"),
        (b"HTTP/2 200\r\n", "HTTP", 'an HTTP response "HTTP/2 200"', "an HTTP server"),
        (b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP", "an HTTP request (GET /index.html)",
         "an HTTP client"),
        (b"GET /chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", "HTTP",
         "a WebSocket handshake (GET /chat)", "a WebSocket client"),
        (b'<!DOCTYPE HTML>\n<html lang="en">', "HTTP", HTML_PAGE, "an HTTP server"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/2", "the HTTP/2 connection preface", "an HTTP/2 client"),
        (bytes.fromhex("000012040000000000000300000064000400100000"), "HTTP/2",
         "an HTTP/2 SETTINGS frame (a server's first frame)", "an HTTP/2 server"),
        (bytes.fromhex("15030300020232"), "TLS", "a TLS alert (decode_error)", "a TLS server"),
        (bytes.fromhex("15030100020228"), "TLS", "a TLS alert (handshake_failure)", "a TLS server"),
        (bytes.fromhex("160303007a020000760303") + bytes(64), "TLS", "a TLS ServerHello record", "a TLS server"),
        (bytes.fromhex("16030100f8010000f40303") + bytes(64), "TLS", "a TLS ClientHello record", "a TLS client"),
        (bytes.fromhex("1703030020") + bytes(32), "TLS", "a TLS application_data record", "a TLS server"),
        (b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n", "SSH",
         'an SSH banner "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3"', "an SSH peer"),
    ],
)  # fmt: skip
def test_the_usual_wrong_peers_are_recognised(data: bytes, name: str, what: str, peer: str) -> None:
    found = identify(data)
    assert found is not None
    assert (found.name, found.what, found.peer) == (name, what, peer)
    assert found.advice


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"HTTP",  # too short to tell
        b"HTTP/1.1 abc\r\n",
        b"GET\r\n",
        b"\x16\x03\x05\x00\x10",  # no such TLS version
        b"\x16\x03\x03\x00\x00",  # an empty record
        b"\x16\x03\x03\xff\xff",  # longer than a TLS record can be
        b"SSH-",
        bytes.fromhex("000013040000000000"),  # a SETTINGS length that is not a multiple of 6
        b"hello world\r\n",
    ],
)
def test_near_misses_are_not_recognised(data: bytes) -> None:
    assert identify(data) is None


class _Heads:
    """A capture sink keeping the first bytes of each direction."""

    def __init__(self, into: dict[str, bytearray], role: str) -> None:
        self.into = into
        self.role = role

    def received(self, data: BytesLike) -> None:
        self.into["server" if self.role == "client" else "client"] += bytes(data)[:256]

    def sent(self, chunks: Sequence[BytesLike]) -> None:
        for chunk in chunks:
            self.into[self.role] += bytes(chunk)[:256]

    def close(self) -> None:
        pass


async def _first_bytes(protocol: str) -> dict[str, bytes]:
    """What a polymux client and server of ``protocol`` send first, each."""
    heads: dict[str, bytearray] = {"client": bytearray(), "server": bytearray()}

    def capture(info: Mapping[str, str]) -> _Heads:
        return _Heads(heads, info["role"])

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.read())
        writer.close()

    async with (
        await polymux.start_server(echo, "127.0.0.1", 0, protocol=protocol, capture=capture) as server,
        await polymux.connect("127.0.0.1", server.port, protocol=protocol) as session,
    ):
        reader, writer = await session.open_pair("a name")
        writer.write(b"GET / HTTP/1.1\r\n\r\n")  # data that looks like HTTP, inside frames
        writer.write_eof()
        await reader.read()
    return {k: bytes(v) for k, v in heads.items()}


@pytest.mark.parametrize("protocol", polymux.PROTOCOLS)
async def test_no_polymux_format_is_taken_for_a_foreign_protocol(protocol: str) -> None:
    async with asyncio.timeout(30):
        heads = await _first_bytes(protocol)
    assert heads["client"], protocol
    for role, data in heads.items():
        assert identify(data) is None, (protocol, role, data[:32])


def test_show_gives_text_or_hex() -> None:
    assert show(b"HTTP/1.1 400 Bad Request\r\nmore") == '"HTTP/1.1 400 Bad Request"'
    assert show(b"x" * 100) == '"' + "x" * 48 + '..."'
    assert show(bytes(range(4))) == "00 01 02 03"
    assert show(bytes(20)) == "00 " * 15 + "00 ..."
