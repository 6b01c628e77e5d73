"""Helpers shared by the ``polymux`` subcommands and the example apps: addresses
(``--tcp HOST:PORT`` / ``--unix PATH``), sizes (``64MiB``), session options, the exit
statuses every command uses, opening a session with a diagnosis when there is none (the
peer speaks another format), which formats have two-way channels, and running a coroutine
on asyncio or uvloop."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import signal
import weakref
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import polymux
from polymux import formats
from polymux._extras import require
from polymux._types import BytesLike
from polymux.exceptions import MissingExtra


__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NO_SESSION",
    "EXIT_OK",
    "EXIT_STATUS",
    "EXIT_USAGE",
    "MIN_SESSION_MEMORY",
    "MIN_WINDOW",
    "MIN_WRITE_BUFFER",
    "SIZE_SYNTAX",
    "Address",
    "NoSession",
    "add_address_options",
    "add_session_options",
    "connect",
    "conversation_options",
    "format_bytes",
    "parse_address",
    "parse_size",
    "peer_mismatch",
    "run",
    "serve_until_stopped",
    "session_options",
    "size",
    "size_type",
    "two_way",
]

T = TypeVar("T")

EXIT_OK = 0
"""Exit status: the command did what was asked."""
EXIT_FAILED = 1
"""Exit status: the work failed (a channel or a file failed, the echo differs, the
connection was lost or timed out mid-way, a server cannot listen, an input file is
missing or cannot be read, an extra the command needs is not installed)."""
EXIT_USAGE = 2
"""Exit status: bad arguments (argparse's own status for usage errors): an option that is
unknown, missing or malformed, a value out of its range. A well-formed path to a file that
is not there is an input that cannot be read (:data:`EXIT_FAILED`)."""
EXIT_NO_SESSION = 3
"""Exit status: no session with the peer (nothing listens there, the connection or its
handshake failed or timed out, or the peer speaks another wire format)."""
EXIT_INTERRUPTED = 130
"""Exit status: interrupted by Ctrl-C (128 + SIGINT, as shells report it)."""

EXIT_STATUS = f"""\
exit status (the same for every polymux command and example):
  {EXIT_OK}    success
  {EXIT_FAILED}    the work failed: a channel or a file failed, the echo differs, the
       connection was lost or timed out mid-way, a server cannot listen, an
       input file is missing or cannot be read, an extra it needs is missing
  {EXIT_USAGE}    bad arguments
  {EXIT_NO_SESSION}    no session: nothing listens there, the connection or its handshake
       failed or timed out, or the peer speaks another wire format
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)"""
"""The exit-status table, as shown at the end of every ``--help``."""

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|(b))?\s*$", re.IGNORECASE)

SIZE_SYNTAX = "a number of bytes with an optional unit: 4096, 512KiB, 16MiB, 1.5GiB"
"""How sizes are written, for help texts and errors."""

MIN_WINDOW = 4 * 1024
"""The smallest ``--window`` the commands take: below it every few bytes wait for a round
trip (``--window 1`` took 14 s for a 64 KiB echo)."""
MIN_WRITE_BUFFER = 1024
"""The smallest ``--write-buffer`` (``write_buffer_high``) the commands take."""
MIN_SESSION_MEMORY = 64 * 1024
"""The smallest ``--max-session-memory`` the commands take."""


def parse_size(text: str, *, minimum: int = 1) -> int:
    """A byte count with an optional unit: ``"4096"``, ``"512B"``, ``"64KiB"``, ``"16MiB"``,
    ``"1.5GiB"``. Units are binary whatever the spelling (``K`` = ``KB`` = ``KiB`` = 1024,
    ``M`` = ``MB`` = ``MiB`` = 1024 KiB, then ``G`` and ``T``), case-insensitive; a number
    without a unit means bytes, everywhere. Every size option of every ``polymux``
    command and example goes through here.

    Raises:
        ValueError: naming the text, when it is not a size, is a fraction of a byte, or is
            below ``minimum`` bytes (saying, for a number without a unit, that it means
            bytes and what the unit would have been).
    """
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} ({SIZE_SYNTAX})")
    digits, unit = match.group(1), (match.group(2) or "").lower()
    if not unit and "." in digits:
        raise ValueError(f"not a whole number of bytes: {text!r} (give a unit: {digits}MiB, {digits}GiB)")
    value = int(float(digits) * 1024 ** " kmgt".index(unit or " "))
    if value < minimum:
        why = f"{text.strip()!r} is {format_bytes(value)}, below the minimum of {format_bytes(minimum)}"
        if not unit and not match.group(3):
            meant = [f"{digits}{u}" for u, f in (("KiB", 1 << 10), ("MiB", 1 << 20)) if value * f >= minimum]
            why += "; a number without a unit means bytes" + (
                f" (did you mean {' or '.join(meant)}?)" if meant else ""
            )
        raise ValueError(why)
    return value


class size_type:  # lower case: used like a function, type=size_type(4096)
    """:func:`parse_size` as an argparse ``type=``, refusing less than ``minimum`` bytes;
    the error names the value, and argparse the option."""

    __name__ = "size"  # argparse names the type in some messages

    def __init__(self, minimum: int = 1) -> None:
        self.minimum = minimum
        """The smallest size accepted, in bytes."""

    def __call__(self, text: str) -> int:
        try:
            return parse_size(text, minimum=self.minimum)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    def __repr__(self) -> str:
        return f"size_type({self.minimum})"


size = size_type(1)
"""An argparse ``type=`` for a size of at least one byte (:func:`size_type`)."""


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
        type=size_type(MIN_WINDOW),
        metavar="SIZE",
        help="receive window per channel (SessionConfig.receive_window), e.g. 256KiB; at least 4KiB",
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
    return not formats.get(protocol).caps.one_way


class NoSession(Exception):
    """No session with the peer: the connection could not be made, its handshake failed or
    timed out, or the peer speaks another format. The message says which (exit status
    :data:`EXIT_NO_SESSION`)."""


_HEAD = 256  # bytes of the peer's first answer kept to tell which format it speaks


class _Heads:
    """A capture sink keeping what the diagnosis needs: the first bytes each way."""

    def __init__(self) -> None:
        self.sent = bytearray()
        self.received = bytearray()

    def received_data(self, data: BytesLike) -> None:
        if len(self.received) < _HEAD:
            self.received += bytes(data[: _HEAD - len(self.received)])

    def sent_data(self, chunks: Sequence[BytesLike]) -> None:
        for chunk in chunks:
            if len(self.sent) >= _HEAD:
                break
            self.sent += bytes(chunk[: _HEAD - len(self.sent)])


class _HeadSink:
    # The CaptureSink protocol's names, forwarding to one _Heads (kept after the session).
    def __init__(self, heads: _Heads) -> None:
        self.received = heads.received_data
        self.sent = heads.sent_data

    def close(self) -> None:
        pass


_heads: weakref.WeakKeyDictionary[polymux.Session, _Heads] = weakref.WeakKeyDictionary()


def _mismatch(protocol: str, heads: _Heads, failed: bool = True) -> str | None:
    """Why ``heads`` show no session of ``protocol``, or None if the peer's bytes fit it.

    No session: the peer sent nothing; or its first bytes break ``protocol``; or, once the
    session has failed, they are another format's (as :func:`detect_format` sees them)."""
    from polymux.tracing.decode import decode_chunks
    from polymux.tracing.detect import detect_format

    received = bytes(heads.received)
    if not received:
        return f"the peer sent nothing back: is it a {protocol} peer? (a peer of another format says nothing)"
    other = detect_format(b"", received)
    if other is not None and _wire(other) != _wire(protocol):
        records = decode_chunks(protocol, [(0, "s2c", received)], session="check", one_way=True)
        if failed or any(r.frame_type == "violation" for r in records):
            return f"the peer speaks {other}, not {protocol} (run both sides with the same --protocol)"
        return None
    records = decode_chunks(protocol, [(0, "s2c", received)], session="check", one_way=True)
    if any(r.frame_type == "violation" for r in records):
        return f"the peer does not speak {protocol}: its first bytes are {received[:16].hex(' ')}"
    return None


def _wire(protocol: str) -> str:
    # One wire may carry several formats (mplex and multiplex): detection names the family.
    return formats.get(protocol).family


def peer_mismatch(session: polymux.Session) -> str | None:
    """For a session opened with :func:`connect` that has failed: a sentence saying that the
    peer never spoke its format (it sent nothing, or bytes of another format, naming that
    format where :func:`polymux.tracing.detect_format` recognises it), or None when the peer
    did speak it (the failure came later, and is not a missing session)."""
    heads = _heads.get(session)
    if heads is None:
        return None
    return _mismatch(session.protocol, heads)


async def connect(
    address: Address,
    protocol: str,
    *,
    timeout: float | None = None,  # noqa: ASYNC109 - its expiry is diagnosed, not just raised
    **options: Any,
) -> polymux.Session:
    """A session to ``address``, within ``timeout`` seconds (connection and handshake).

    The first bytes each way are kept (a tiny capture sink) so that :func:`peer_mismatch`
    can later tell a peer of another format from a failure mid-way.

    Raises:
        NoSession: with a message naming the address, the format and what went wrong
            (refused, timed out, the handshake failed, the peer speaks another format).
    """
    heads = _Heads()
    if options.get("capture") is None:
        options["capture"] = lambda _info: _HeadSink(heads)
    try:
        async with asyncio.timeout(timeout):
            if address.path is not None:
                session = await polymux.connect_unix(address.path, protocol=protocol, **options)
            else:
                assert address.host is not None
                session = await polymux.connect(address.host, address.port, protocol=protocol, **options)
    except TimeoutError:
        assert timeout is not None
        why = (
            "no answer" if not heads.sent else (_mismatch(protocol, heads) or "the handshake did not finish")
        )
        raise NoSession(f"cannot connect to {address} ({protocol}) within {timeout:g} s: {why}") from None
    except polymux.PolymuxError as exc:  # before OSError: SessionClosed is a ConnectionError too
        reason = _mismatch(protocol, heads)
        raise NoSession(f"cannot connect to {address} ({protocol}): {reason or exc}") from None
    except OSError as exc:
        raise NoSession(f"cannot connect to {address} ({protocol}): {exc.strerror or exc}") from None
    _heads[session] = heads
    return session


def conversation_options(protocol: str) -> dict[str, Any]:
    """SessionConfig options for a server whose channels are conversations (a request, an
    answer, more of the request ...): on Streamux, whose responses otherwise wait for the
    end of their request, ``streamux_early_responses`` (a polymux extension: every peer
    must be polymux). Nothing for other formats."""
    option = formats.get(protocol).caps.conversation_option
    return {option: True} if option is not None else {}


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


async def serve_until_stopped(
    server: polymux.Server | polymux.Bridge, logger: logging.Logger, grace: float = 15.0
) -> None:
    """Serve until Ctrl-C or SIGTERM, then close ``server`` gracefully (its sessions flush
    what they queued), cutting it after ``grace`` seconds (``polymux serve``, ``polymux
    bridge``)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        logger.info("stopping")
        try:
            async with asyncio.timeout(grace):
                await server.aclose()
        except TimeoutError:
            server.close()


def run(coro: Coroutine[Any, Any, T], *, use_uvloop: bool = False) -> T:
    """Run ``coro`` on a new event loop (uvloop's if asked)."""
    if use_uvloop:
        try:
            uvloop = require("uvloop", "--uvloop")
        except MissingExtra:
            coro.close()  # never awaited: no "was never awaited" warning
            raise
        result: T = uvloop.run(coro)
        return result
    return asyncio.run(coro)
