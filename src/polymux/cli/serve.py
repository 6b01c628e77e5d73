"""polymux serve: a server that echoes (or discards) every channel of every session,
logging one line per channel on stderr (name, peer, bytes in and out, seconds, outcome),
and one per connection whose client never spoke the format (what it sent instead).

The first line on stdout says what it does and where it listens, with the real port when
given --tcp HOST:0, for every format ("polymux serve: echo yamux on tcp:127.0.0.1:9000").
On formats whose channels are one-way (omnistreams: the opener writes, the acceptor reads)
it discards, and the second line says why. Ctrl-C or SIGTERM stops it cleanly: it stops
listening, closes the sessions (bounded by close_timeout), removes its unix socket, prints
a summary and exits 0. A server that cannot listen exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

import polymux
from polymux.apps.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS,
    MIN_SESSION_MEMORY,
    Address,
    add_address_options,
    add_liveness_options,
    add_server_options,
    add_session_options,
    check_session_options,
    diagnosing_capture,
    format_bytes,
    listen,
    listening_on,
    liveness_options,
    parse_address,
    run as run_loop,
    serve_until_stopped,
    server_options,
    session_options,
    size_type,
    two_way,
)


__all__ = ["register", "run"]

logger = logging.getLogger("polymux.serve")


@dataclass
class _Totals:
    sessions: int = 0
    channels: int = 0
    failed: int = 0
    refused: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux serve``."""
    parser = sub.add_parser(
        "serve",
        help="echo or discard every channel (a peer for polymux connect)",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_session_options(parser)
    add_address_options(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--echo", action="store_true", help="send every channel's bytes back (the default)")
    mode.add_argument("--discard", action="store_true", help="read and drop every channel's bytes")
    parser.add_argument("--quiet", action="store_true", help="no line per channel")
    limits = parser.add_argument_group("limits (SECURITY.md)")
    limits.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        metavar="N",
        help="connections held at once, counted from their accept; when full, the oldest that has "
        "sent nothing yet is closed to make room, else the new one is dropped (default 1024)",
    )
    limits.add_argument(
        "--max-session-memory",
        type=size_type(MIN_SESSION_MEMORY),
        metavar="SIZE",
        help="per-connection budget of unread + unsent bytes, e.g. 32MiB (default 32MiB; at least 64KiB)",
    )
    add_server_options(limits)
    add_liveness_options(
        limits,
        handshake_help="seconds a new connection may take to send its handshake, or on formats without one "
        "its first frame; a connection silent that long is closed (default 10)",
        idle_help="seconds a session with no channels may go without a frame before it is closed, "
        "or off (default 300)",
    )
    parser.set_defaults(func=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    """Run ``polymux serve``."""
    try:
        address = parse_address(args.tcp, args.unix)
        options = session_options(args)
        if args.max_session_memory is not None:
            options["max_session_memory"] = args.max_session_memory
        options.update(liveness_options(args))
        check_session_options(args.protocol, options)
        if args.max_connections <= 0:
            raise ValueError(f"--max-connections must be positive, got {args.max_connections}")
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    if args.quiet:
        logger.setLevel(logging.WARNING)
    mode = "discard" if args.discard else "echo"
    return run_loop(
        _serve(args.protocol, address, mode, options, args.max_connections, server_options(args)),
        use_uvloop=args.uvloop,
    )


async def _serve(
    protocol: str,
    address: Address,
    mode: str,
    options: dict[str, object],
    max_connections: int = 1024,
    limits: dict[str, Any] | None = None,
) -> int:
    loop = asyncio.get_running_loop()
    note = None
    if mode == "echo" and not two_way(protocol):
        note = (
            f"polymux serve: {protocol} channels are one-way (the opener writes, we read): "
            "echo is impossible, serving in discard mode"
        )
        mode = "discard"
    echo = mode == "echo"
    totals = _Totals()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        start = loop.time()
        label = writer.get_extra_info("channel") or repr(writer.get_extra_info("channel_name"))
        peer = writer.get_extra_info("peername") or "unix"
        n_in = n_out = 0
        outcome = "ok"
        totals.channels += 1
        try:
            while data := await reader.read(256 * 1024):
                n_in += len(data)
                if echo:
                    writer.write(data)
                    await writer.drain()
                    n_out += len(data)
            writer.close()
        except (ConnectionError, polymux.PolymuxError) as exc:
            outcome = f"failed: {exc}"
            totals.failed += 1
            writer.transport.abort()
        totals.bytes_in += n_in
        totals.bytes_out += n_out
        logger.info(
            "%s from %s: %d bytes in, %d bytes out, %.3f s, %s",
            label,
            _fmt_peer(peer),
            n_in,
            n_out,
            loop.time() - start,
            outcome,
        )

    def session_opened(session: polymux.Session) -> None:
        totals.sessions += 1
        logger.info("session from %s (%s)", _fmt_peer(session.get_extra_info("peername") or "unix"), protocol)

    def not_a_session(peer: str, why: str) -> None:
        # Every connection whose client never spoke the format, handshake or not.
        totals.refused += 1
        logger.warning("connection from %s: no %s session: %s", peer, protocol, why)

    try:
        server = await listen(
            address,
            handle,
            protocol,
            session_handler=session_opened,
            max_connections=max_connections,
            capture=diagnosing_capture(protocol, not_a_session),
            **(limits or {}),
            **options,
        )
    except OSError as exc:
        print(f"polymux serve: cannot listen on {address}: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    # The first line is where we listen, whatever the format (scripts wait for it).
    print(f"polymux serve: {mode} {protocol} on {listening_on(server, address)}", flush=True)
    if note is not None:
        print(note, flush=True)
    try:
        await serve_until_stopped(server, logger)
    finally:
        if address.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(address.path)
    print(
        f"polymux serve: stopped; {totals.sessions} sessions, "
        + (f"{totals.refused} connections without one, " if totals.refused else "")
        + f"{totals.channels} channels "
        f"({totals.failed} failed), {format_bytes(totals.bytes_in)} in, {format_bytes(totals.bytes_out)} out",
        flush=True,
    )
    return EXIT_OK


def _fmt_peer(peer: object) -> str:
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
