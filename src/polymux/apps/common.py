"""Helpers shared by the ``polymux`` subcommands and the example apps: addresses
(``--tcp HOST:PORT`` / ``--unix PATH``), sizes (``16M``), session options, which formats
have two-way channels, and running a coroutine on asyncio or uvloop."""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import polymux
from polymux.engine import make_engine


__all__ = [
    "Address",
    "add_address_options",
    "add_session_options",
    "connect",
    "conversation_options",
    "format_bytes",
    "parse_address",
    "parse_size",
    "run",
    "session_options",
    "two_way",
]

T = TypeVar("T")

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"64K"``, ``"16M"``, ``"1.5G"``, ``"1000"`` -> bytes (binary multiples: K = 1024).

    Raises ``ValueError`` naming the text."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 64K, 16M, 1G)")
    number, unit = float(match.group(1)), match.group(2).lower()
    value = int(number * 1024 ** " kmgt".index(unit or " "))
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def format_bytes(n: float) -> str:
    """A human-readable byte count (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Address:
    """Where to listen or connect: TCP ``host:port``, or a unix socket ``path``."""

    host: str | None = None
    port: int = 0
    path: str | None = None

    def __str__(self) -> str:
        if self.path is not None:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"tcp:{host}:{self.port}"


def parse_address(tcp: str | None, unix: str | None) -> Address:
    """The address of ``--tcp HOST:PORT`` or ``--unix PATH``; raises ``ValueError``."""
    if unix is not None:
        if not unix or "\0" in unix:
            raise ValueError(f"--unix: not a usable socket path: {unix!r}")
        if len(unix.encode()) > 107:
            raise ValueError(f"--unix: socket paths are limited to 107 bytes, got {len(unix.encode())}")
        return Address(path=unix)
    if tcp is None:
        raise ValueError("give --tcp HOST:PORT or --unix PATH")
    host, sep, port = tcp.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--tcp: expected HOST:PORT with a port in 0..65535, got {tcp!r}")
    host = host.strip("[]") or "127.0.0.1"
    return Address(host=host, port=int(port))


def add_address_options(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--tcp HOST:PORT`` or ``--unix PATH`` (one of them)."""
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--tcp", metavar="HOST:PORT", help="TCP address (port 0 picks a free port)")
    group.add_argument("--unix", metavar="PATH", help="unix socket path")


def add_session_options(parser: argparse.ArgumentParser) -> None:
    """``--protocol``, ``--window``, ``--uvloop``."""
    parser.add_argument(
        "--protocol",
        required=True,
        choices=polymux.PROTOCOLS,
        metavar="PROTOCOL",
        help=f"wire format: {', '.join(polymux.PROTOCOLS)}",
    )
    parser.add_argument(
        "--window",
        type=parse_size,
        metavar="BYTES",
        help="receive window per channel (SessionConfig.receive_window), e.g. 256K",
    )
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")


def session_options(args: argparse.Namespace) -> dict[str, Any]:
    """SessionConfig fields from ``add_session_options``' arguments."""
    options: dict[str, Any] = {}
    if getattr(args, "window", None) is not None:
        options["receive_window"] = args.window
    return options


def two_way(protocol: str) -> bool:
    """Whether channels of ``protocol`` carry data both ways (False for formats whose
    streams are one-directional, like omnistreams: the opener writes, the acceptor reads).
    """
    engine = make_engine(protocol)
    for name in ("two_way", "bidirectional"):
        value = getattr(engine, name, None)
        if isinstance(value, bool):
            return value
    for name in ("one_way", "unidirectional"):
        value = getattr(engine, name, None)
        if isinstance(value, bool):
            return not value
    return not protocol.startswith("omnistreams")


def conversation_options(protocol: str) -> dict[str, Any]:
    """SessionConfig options for a server whose channels are conversations (a request, an
    answer, more of the request ...): on Streamux, whose responses otherwise wait for the
    end of their request, ``streamux_early_responses`` (a polymux extension: every peer
    must be polymux). Nothing for other formats."""
    return {"streamux_early_responses": True} if protocol == "streamux" else {}


async def connect(address: Address, protocol: str, **options: Any) -> polymux.Session:
    """A session to ``address``."""
    if address.path is not None:
        return await polymux.connect_unix(address.path, protocol=protocol, **options)
    assert address.host is not None
    return await polymux.connect(address.host, address.port, protocol=protocol, **options)


async def listen(address: Address, handler: Any, protocol: str, **kwargs: Any) -> polymux.Server:
    """A polymux server on ``address``."""
    if address.path is not None:
        return await polymux.start_unix_server(handler, address.path, protocol=protocol, **kwargs)
    return await polymux.start_server(handler, address.host, address.port, protocol=protocol, **kwargs)


def listening_on(server: polymux.Server, address: Address) -> Address:
    """``address`` with the port the server really got (``port=0``)."""
    if address.path is not None:
        return address
    return Address(host=address.host, port=server.port)


def run(coro: Coroutine[Any, Any, T], *, use_uvloop: bool = False) -> T:
    """Run ``coro`` on a new event loop (uvloop's if asked)."""
    if use_uvloop:
        import uvloop

        result: T = uvloop.run(coro)
        return result
    return asyncio.run(coro)
