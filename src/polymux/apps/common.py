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
import socket
import weakref
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

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
    "Closable",
    "NoSession",
    "add_address_options",
    "add_liveness_options",
    "add_server_options",
    "add_session_options",
    "check_session_options",
    "connect",
    "conversation_options",
    "diagnosing_capture",
    "format_bytes",
    "liveness_options",
    "parse_address",
    "parse_size",
    "peer_mismatch",
    "run",
    "seconds",
    "seconds_or_off",
    "serve_until_stopped",
    "server_options",
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


def seconds_or_off(text: str) -> float | None:
    """A positive number of seconds, or ``off`` (``None``), as an argparse ``type=``."""
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r} (or 'off')") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r} (or 'off')")
    return value


def seconds(text: str) -> float:
    """A positive number of seconds, as an argparse ``type=``."""
    value = seconds_or_off(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be a number of seconds: {text!r}")
    return value


def add_liveness_options(group: argparse._ArgumentGroup, *, handshake_help: str, idle_help: str) -> None:
    """``--handshake-timeout``, ``--idle-timeout``, ``--keepalive-interval`` and
    ``--keepalive-timeout``, as every long-lived command (``serve``, ``bridge``) takes them,
    with the first two's help in the command's words; unset, the session's defaults hold
    (:func:`liveness_options`)."""
    group.add_argument("--handshake-timeout", type=seconds, metavar="SECONDS", help=handshake_help)
    group.add_argument(
        "--idle-timeout", type=seconds_or_off, default=argparse.SUPPRESS, metavar="SECONDS", help=idle_help
    )
    group.add_argument(
        "--keepalive-interval",
        type=seconds_or_off,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="seconds between keepalive pings (heartbeats on formats without pings, at least every "
        "15 s), or off (default 15)",
    )
    group.add_argument(
        "--keepalive-timeout",
        type=seconds,
        metavar="SECONDS",
        help="seconds a ping may go unanswered, or a peer that sends heartbeats stay silent past its "
        "interval, before the session fails (default 10)",
    )


def liveness_options(args: argparse.Namespace) -> dict[str, Any]:
    """The SessionConfig fields the options of :func:`add_liveness_options` set."""
    options = {
        field: getattr(args, field)
        for field in ("handshake_timeout", "keepalive_timeout")
        if getattr(args, field) is not None
    }
    # "off" is None, so these two are absent from args unless given (default=SUPPRESS).
    options.update(
        {
            field: getattr(args, field)
            for field in ("idle_timeout", "keepalive_interval")
            if hasattr(args, field)
        }
    )
    return options


MIN_MAX_MEMORY = 1024 * 1024
"""The smallest ``--max-memory`` the commands take."""


def add_server_options(group: argparse._ActionsContainer) -> None:
    """``--max-memory`` and ``--max-connections-per-address``, as every command that
    serves takes them (``serve``, ``bridge``, the file receiver, the chat servers); unset,
    the server's defaults hold (:func:`server_options`)."""
    group.add_argument(
        "--max-memory",
        type=size_type(MIN_MAX_MEMORY),
        metavar="SIZE",
        help="what all the sessions may hold together in buffers, e.g. 256MiB: past it, the sessions "
        "holding the most stop being read until it is down to three quarters (default: no limit "
        "beyond each session's own; at least 1MiB)",
    )
    group.add_argument(
        "--max-connections-per-address",
        type=_connections_or_off,
        default=argparse.SUPPRESS,
        metavar="N",
        help="connections one peer address may hold at once; more are refused and logged, or off "
        "(default 256)",
    )


def _connections_or_off(text: str) -> int | None:
    if text.strip().lower() == "off":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of connections: {text!r} (or 'off')") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r} (or 'off')")
    return value


def server_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``polymux.start_server`` (and ``serve_websocket``) that the
    options of :func:`add_server_options` set."""
    options: dict[str, Any] = {}
    if getattr(args, "max_memory", None) is not None:
        options["max_memory"] = args.max_memory
    if hasattr(args, "max_connections_per_address"):  # "off" is None: absent unless given
        options["max_connections_per_address"] = args.max_connections_per_address
    return options


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


def add_session_options(parser: argparse.ArgumentParser, *, default: str | None = None) -> None:
    """``--protocol`` (required, unless it has a ``default``), ``--window``, ``--uvloop``."""
    parser.add_argument(
        "--protocol",
        required=default is None,
        default=default,
        choices=polymux.PROTOCOLS,
        metavar="PROTOCOL",
        help=f"wire format: {', '.join(polymux.PROTOCOLS)}" + (f" (default {default})" if default else ""),
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


def check_session_options(protocol: str, options: dict[str, Any]) -> None:
    """That ``options`` (SessionConfig fields) are valid, and mean something to
    ``protocol`` (a setting it would ignore is refused: ``formats.resolve``).

    Raises:
        TypeError: an unknown option.
        ValueError: a bad value, or one the format cannot honour (``--window`` below 256 KiB
            on yamux, whose windows start there).
    """
    try:
        formats.resolve(protocol, polymux.SessionConfig.from_options(**options))
    except ValueError as exc:
        if "receive_window" in str(exc) and "receive_window" in options:
            raise ValueError(f"--window: {exc}") from None
        raise


def two_way(protocol: str) -> bool:
    """Whether channels of ``protocol`` carry data both ways (False for formats whose
    streams are one-directional, like omnistreams: the opener writes, the acceptor reads).
    """
    return not formats.get(protocol).caps.one_way


class NoSession(Exception):
    """No session with the peer: the connection could not be made, its handshake failed or
    timed out, or the peer speaks another format. The message says which (exit status
    :data:`EXIT_NO_SESSION`)."""


_HEAD = 512  # bytes of the peer's first answer kept to tell what it speaks


class _Heads:
    """A capture sink keeping what the diagnosis needs: the first bytes each way.

    ``spare``, a duplicate of the connection's socket, lets :meth:`salvage` read what the
    peer sent that the session never read: a session that fails on a write (the peer closed
    first: EPIPE, ECONNRESET) stops reading at once, though the peer's answer (an HTTP
    error page, a go-away) is there. It is closed when the connection is lost (the sink's
    ``close``), before the session's own socket, so the connection ends as it would."""

    def __init__(self) -> None:
        self.sent = bytearray()
        self.received = bytearray()
        self.spare: socket.socket | None = None

    def received_data(self, data: BytesLike) -> None:
        if len(self.received) < _HEAD:
            self.received += bytes(data[: _HEAD - len(self.received)])

    def sent_data(self, chunks: Sequence[BytesLike]) -> None:
        for chunk in chunks:
            if len(self.sent) >= _HEAD:
                break
            self.sent += bytes(chunk[: _HEAD - len(self.sent)])

    def salvage(self) -> None:
        """The connection is ending: take what the peer sent and the session did not read
        (without waiting), then let go of the spare socket."""
        spare, self.spare = self.spare, None
        if spare is None:
            return
        try:
            while len(self.received) < _HEAD:
                data = spare.recv(_HEAD - len(self.received), socket.MSG_DONTWAIT)
                if not data:
                    break
                self.received += data
        except OSError:
            pass  # nothing more (EAGAIN), or the reset itself: what came before it is kept
        finally:
            spare.close()


class _HeadSink:
    # The CaptureSink protocol's names, forwarding to one _Heads (kept after the session).
    def __init__(self, heads: _Heads) -> None:
        self.received = heads.received_data
        self.sent = heads.sent_data
        self.close = heads.salvage  # called as the connection is lost, before its socket closes


_heads: weakref.WeakKeyDictionary[polymux.Session, _Heads] = weakref.WeakKeyDictionary()


def _found_mismatch(error: BaseException | None) -> bool:
    """``error`` or one of its causes is a :class:`polymux.exceptions.FormatMismatch`."""
    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, polymux.FormatMismatch):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def _diagnose(
    protocol: str,
    heads: _Heads,
    *,
    error: BaseException | None = None,
    waited: float | None = None,
    role: str = "peer",
) -> str | None:
    """Why ``heads`` show no ``protocol`` session (:func:`polymux.tracing.diagnose`), or
    None if the peer's bytes fit it (the failure came later). ``waited``: we gave up after
    that many seconds (else the connection ended)."""
    from polymux.tracing import diagnose

    diagnosis = diagnose(
        protocol,
        bytes(heads.received),
        closed=waited is None,
        waited=waited,
        mismatch=_found_mismatch(error),
        peer_role=role,
    )
    return None if diagnosis is None else str(diagnosis)


class _ClientSink:
    """A server's capture sink: at the end of the connection, ``report(peer, why)`` when the
    client never spoke the format (:func:`diagnosing_capture`)."""

    def __init__(self, protocol: str, peer: str, report: Callable[[str, str], None]) -> None:
        self.heads = _Heads()
        self.protocol = protocol
        self.peer = peer
        self.report = report
        self.received = self.heads.received_data  # the CaptureSink protocol's names
        self.sent = self.heads.sent_data

    def close(self) -> None:
        why = _diagnose(self.protocol, self.heads, role="client")
        if why is not None:
            self.report(self.peer, why)


def diagnosing_capture(protocol: str, report: Callable[[str, str], None]) -> Callable[..., Any]:
    """A ``capture=`` factory for a server of ``protocol`` that keeps each connection's first
    bytes and, when it ends, calls ``report(peer, why)`` if the client never spoke the format
    (it sent nothing, or bytes of something else: :func:`polymux.tracing.diagnose`). Every
    wrong-format connection is reported, handshake or not, whatever the session did."""

    def factory(info: Any) -> _ClientSink:
        return _ClientSink(protocol, info.get("peer") or "unix", report)

    return factory


def peer_mismatch(session: polymux.Session, *, waited: float | None = None) -> str | None:
    """For a session opened with :func:`connect` that has failed: a sentence saying that the
    peer never spoke its format (what it sent instead, what it speaks when that can be
    named with confidence, and what to try: :func:`polymux.tracing.diagnose`), or None when
    the peer did speak it (the failure came later, and is not a missing session).
    ``waited``: the run gave up after that many seconds (the peer did not close)."""
    heads = _heads.get(session)
    if heads is None:
        return None
    heads.salvage()  # the session is over: what it did not read is read now (if not yet)
    return _diagnose(session.protocol, heads, error=session.exception, waited=waited, role="server")


async def _open_socket(address: Address) -> socket.socket:
    """A connected non-blocking socket to ``address`` (each of the host's addresses in
    turn, as ``loop.create_connection`` does)."""
    loop = asyncio.get_running_loop()
    if address.path is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address.path)
        except BaseException:
            sock.close()
            raise
        return sock
    assert address.host is not None
    infos = await loop.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"cannot resolve {address.host!r}")
    for family, kind, proto, _name, where in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, where)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error


async def connect(
    address: Address,
    protocol: str,
    *,
    timeout: float | None = None,  # noqa: ASYNC109 - its expiry is diagnosed, not just raised
    **options: Any,
) -> polymux.Session:
    """A session to ``address``, within ``timeout`` seconds (connection and handshake).

    The first bytes each way are kept (a tiny capture sink), even those the session never
    read, so that :func:`peer_mismatch` can later tell a peer of another format from a
    failure mid-way.

    Raises:
        NoSession: with a message naming the address, the format and what went wrong
            (refused, timed out, the handshake failed, what the peer speaks instead).
    """
    heads = _Heads()
    ours = options.get("capture") is None  # a caller's own capture: no diagnosis bytes
    if ours:
        options["capture"] = lambda _info: _HeadSink(heads)
    sock: socket.socket | None = None
    try:
        async with asyncio.timeout(timeout):
            sock = await _open_socket(address)
            if ours:
                heads.spare = sock.dup()
            if address.path is not None:
                session = await polymux.connect_unix(None, protocol=protocol, sock=sock, **options)
            else:
                # host and port None: the socket is connected (loop.create_connection's sock=)
                session = await polymux.connect(None, None, protocol=protocol, sock=sock, **options)  # type: ignore[arg-type]
    except TimeoutError:
        assert timeout is not None
        heads.salvage()
        if sock is None:
            why = "no answer to the connection request"
        else:
            why = _diagnose(protocol, heads, waited=timeout, role="server") or "the handshake did not finish"
        raise NoSession(f"cannot connect to {address} ({protocol}) within {timeout:g} s: {why}") from None
    except polymux.PolymuxError as exc:  # before OSError: SessionClosed is a ConnectionError too
        heads.salvage()
        reason = _diagnose(protocol, heads, error=exc, role="server")
        raise NoSession(f"cannot connect to {address} ({protocol}): {reason or exc}") from None
    except OSError as exc:
        heads.salvage()
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


class Closable(Protocol):
    """What :func:`serve_until_stopped` stops: a server, a bridge, a forward's end."""

    async def aclose(self) -> None:
        """Stop gracefully (and wait)."""

    def close(self) -> None:
        """Stop at once."""


async def serve_until_stopped(
    server: Closable, logger: logging.Logger, grace: float = 15.0, ready: Callable[[], None] | None = None
) -> None:
    """Serve until Ctrl-C or SIGTERM, then close ``server`` gracefully (its sessions flush
    what they queued), cutting it after ``grace`` seconds (``polymux serve``, ``polymux
    bridge``, ``polymux forward``). ``ready()`` runs once the signals are caught (a line
    that tells scripts they may signal)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if ready is not None:
            ready()
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
