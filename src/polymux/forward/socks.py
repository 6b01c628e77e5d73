"""The server side of SOCKS5 (RFC 1928) for ``-D``: no authentication, CONNECT only, to an
IPv4 or IPv6 address or a domain name (which the far end resolves)."""

from __future__ import annotations

import asyncio
import ipaddress

from polymux.forward.request import ForwardError, Reply
from polymux.forward.spec import HostPort


__all__ = ["SocksRefused", "read_request", "send_reply"]

_VERSION = 5
_NO_AUTH = 0
_NO_METHOD = 0xFF
_CONNECT = 1


class SocksRefused(ForwardError):
    """The client's request was refused during the negotiation (and told so, when the
    protocol allows a reply)."""


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> HostPort:
    """Negotiate with a SOCKS5 client up to its CONNECT request; return the target. The
    client is told of any refusal (no acceptable method, a command other than CONNECT,
    an unknown address type) before :class:`SocksRefused` is raised. Bound the call with a
    timeout: a client that stops mid-way waits for ever here.

    Raises:
        SocksRefused: not SOCKS5, no "no authentication" method, not CONNECT, a bad address.
        asyncio.IncompleteReadError: the client went away.
    """
    head = await reader.readexactly(2)
    if head[0] != _VERSION:
        raise SocksRefused(f"not a SOCKS5 client (version byte {head[0]:#04x})")
    methods = await reader.readexactly(head[1])
    if _NO_AUTH not in methods:
        writer.write(bytes((_VERSION, _NO_METHOD)))
        raise SocksRefused("the SOCKS5 client offers no method without authentication")
    writer.write(bytes((_VERSION, _NO_AUTH)))
    version, command, _reserved, kind = await reader.readexactly(4)
    if version != _VERSION:
        raise SocksRefused(f"SOCKS5 request with version byte {version:#04x}")
    if kind == 1:
        host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
    elif kind == 4:
        host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
    elif kind == 3:
        length = (await reader.readexactly(1))[0]
        raw = await reader.readexactly(length)
        try:
            host = raw.decode("ascii")
        except UnicodeDecodeError:
            host = ""
        if not host or not host.isprintable() or " " in host:
            await reader.readexactly(2)
            send_reply(writer, Reply.HOST_UNREACHABLE)
            raise SocksRefused(
                f"SOCKS5 request for an unusable host name {raw[:60]!r}", Reply.HOST_UNREACHABLE
            )
    else:
        send_reply(writer, Reply.ADDRESS_TYPE_NOT_SUPPORTED)
        raise SocksRefused(f"SOCKS5 address type {kind} is not supported", Reply.ADDRESS_TYPE_NOT_SUPPORTED)
    port = int.from_bytes(await reader.readexactly(2), "big")
    if command != _CONNECT:
        send_reply(writer, Reply.COMMAND_NOT_SUPPORTED)
        what = {2: "BIND", 3: "UDP ASSOCIATE"}.get(command, f"command {command}")
        raise SocksRefused(f"SOCKS5 {what} is not supported (CONNECT only)", Reply.COMMAND_NOT_SUPPORTED)
    if port == 0:
        send_reply(writer, Reply.ADDRESS_TYPE_NOT_SUPPORTED)
        raise SocksRefused("SOCKS5 CONNECT to port 0", Reply.ADDRESS_TYPE_NOT_SUPPORTED)
    return HostPort(host, port)


def send_reply(writer: asyncio.StreamWriter, code: Reply, bound: HostPort | None = None) -> None:
    """Write the reply to a CONNECT request: ``code``, and the address the far end
    connected from (0.0.0.0:0 when unknown or not an address)."""
    address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(0)
    port = 0
    if bound is not None:
        try:
            address = ipaddress.ip_address(bound.host.split("%", 1)[0])
            port = bound.port
        except ValueError:
            pass
    kind = 1 if address.version == 4 else 4
    writer.write(bytes((_VERSION, int(code), 0, kind)) + address.packed + port.to_bytes(2, "big"))
