"""polymux bridge LISTEN CONNECT: listen in one wire format and carry every session to a
session of another format, channel by channel, e.g. an mplex fleet in front of a
yamux-only service:

  polymux bridge mplex:tcp:0.0.0.0:4001 yamux:tcp:10.0.0.5:4002

Endpoints are FORMAT:tcp:HOST:PORT, FORMAT:unix:PATH or FORMAT:ws://HOST:PORT/PATH
(WebSocket; wss:// to connect with TLS), FORMAT being any wire format polymux speaks.
Every session accepted on LISTEN gets one session on CONNECT; every channel opened on
either side is opened on the other, bytes flow both ways with end-to-end backpressure (a
slow reader behind the bridge slows the writer in front of it through the formats' own
credit), and half-closes and resets are carried, with their error text where the target
format carries one. Names cross where both formats carry names; --names says what
happens where only one does: drop (the default) or line (the name becomes the first line
of the channel's bytes, and back).

The first line on stdout says what it carries and where it listens, with the real port
when given port 0 ("polymux bridge: mplex on tcp:127.0.0.1:4001 -> yamux on
tcp:10.0.0.5:4002"); one line per session and per channel goes to stderr. Ctrl-C or
SIGTERM stops it cleanly: it stops listening, closes both sides of every session (bounded
by close_timeout), removes its unix socket, prints a summary and exits 0. A bridge that
cannot listen exits 1. A session whose CONNECT side cannot be opened is kept for a moment
(2 s at most) so that the channels its client opens are reset with the reason (as text
where the format carries one), then closed; the bridge goes on.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import polymux
from polymux.apps.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS,
    MIN_SESSION_MEMORY,
    MIN_WINDOW,
    MIN_WRITE_BUFFER,
    add_liveness_options,
    add_server_options,
    check_session_options,
    format_bytes,
    liveness_options,
    run as run_loop,
    serve_until_stopped,
    server_options,
    size_type,
)
from polymux.bridging import NAME_POLICIES, Bridge, Endpoint


__all__ = ["register", "run"]

logger = logging.getLogger("polymux.bridge")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux bridge``."""
    parser = sub.add_parser(
        "bridge",
        help="carry every session and channel from one wire format to another",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "listen",
        metavar="LISTEN",
        help="where to listen: FORMAT:tcp:HOST:PORT (port 0: any free port), FORMAT:unix:PATH or "
        "FORMAT:ws://HOST:PORT/PATH",
    )
    parser.add_argument(
        "connect",
        metavar="CONNECT",
        help="where to carry each session: FORMAT:tcp:HOST:PORT, FORMAT:unix:PATH, "
        "FORMAT:ws://HOST:PORT/PATH or FORMAT:wss://...",
    )
    parser.add_argument(
        "--names",
        choices=NAME_POLICIES,
        default="drop",
        metavar="POLICY",
        help="names between a format with names and one without: drop (the default) or line "
        "(written as the first line of the channel, and read back from it)",
    )
    parser.add_argument(
        "--window",
        type=size_type(MIN_WINDOW),
        metavar="SIZE",
        help="receive window per channel on both sides (SessionConfig.receive_window), e.g. 256KiB; "
        "at least 4KiB",
    )
    parser.add_argument(
        "--write-buffer",
        type=size_type(MIN_WRITE_BUFFER),
        metavar="SIZE",
        help="unsent bytes per channel before the copy waits (SessionConfig.write_buffer_high), e.g. "
        "64KiB; at least 1KiB",
    )
    parser.add_argument(
        "--capture-listen",
        metavar="DIR",
        help="record the raw bytes of the listening side's sessions into DIR (polymux captures; needs pyarrow)",
    )
    parser.add_argument(
        "--capture-connect",
        metavar="DIR",
        help="record the raw bytes of the connecting side's sessions into DIR (the same DIR is fine)",
    )
    parser.add_argument("--quiet", action="store_true", help="no line per channel")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    limits = parser.add_argument_group("limits and timeouts, both sides (SECURITY.md)")
    limits.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        metavar="N",
        help="sessions accepted at once, each with its session on CONNECT, counted from the accept; when full, "
        "connections that never spoke are closed first, then new ones dropped (default 1024)",
    )
    limits.add_argument(
        "--max-session-memory",
        type=size_type(MIN_SESSION_MEMORY),
        metavar="SIZE",
        help="budget of unread + unsent bytes per bridged pair (the accepted session and its session on "
        "CONNECT, a third each: a session holds up to 1.5 x its share), e.g. 32MiB (default 32MiB; at least 64KiB)",
    )
    add_server_options(limits)
    add_liveness_options(
        limits,
        handshake_help="seconds a session may take to connect and complete its handshake, and a LISTEN "
        "connection to send its first frame (default 10)",
        idle_help="seconds a session with no channels may stay silent before it is closed, or off (default 300)",
    )
    parser.set_defaults(func=run, parser=parser)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """SessionConfig fields from the arguments (both sides)."""
    options: dict[str, Any] = {}
    for arg, field in (
        ("window", "receive_window"),
        ("write_buffer", "write_buffer_high"),
        ("max_session_memory", "max_session_memory"),
    ):
        value = getattr(args, arg)
        if value is not None:
            options[field] = value
    options.update(liveness_options(args))
    return options


def run(args: argparse.Namespace) -> int:
    """Run ``polymux bridge``."""
    try:
        listen = Endpoint.parse(args.listen)
        connect = Endpoint.parse(args.connect)
        if connect.transport != "unix" and connect.port == 0:
            raise ValueError(f"CONNECT {args.connect!r}: a port is needed to connect")
        if listen.transport == "ws" and str(listen.uri).startswith("wss:"):
            raise ValueError(
                f"LISTEN {args.listen!r}: the bridge listens on ws:// only (put a TLS proxy in front)"
            )
        options = _options(args)
        for endpoint in (listen, connect):
            check_session_options(endpoint.protocol, options)
        if args.max_connections <= 0:
            raise ValueError(f"--max-connections must be positive, got {args.max_connections}")
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    if args.quiet:
        logger.setLevel(logging.WARNING)
    recorders = []
    sides: dict[str, dict[str, Any]] = {"listen": {}, "connect": {}}
    for side, directory in (("listen", args.capture_listen), ("connect", args.capture_connect)):
        if directory is None:
            continue
        from polymux.tracing import CaptureRecorder

        try:
            recorder = CaptureRecorder(directory)  # without pyarrow: MissingExtra, one line (cli.main)
        except OSError as exc:
            args.parser.error(f"--capture-{side}: {exc}")
        recorders.append(recorder)
        sides[side]["capture"] = recorder
    try:
        return run_loop(
            _bridge(args, listen, connect, options, sides, args.max_connections), use_uvloop=args.uvloop
        )
    finally:
        for recorder in recorders:
            recorder.close()


async def _bridge(
    args: argparse.Namespace,
    listen: Endpoint,
    connect: Endpoint,
    options: dict[str, Any],
    sides: dict[str, dict[str, Any]],
    max_connections: int,
) -> int:
    listen_config = polymux.SessionConfig.from_options(**options, **sides["listen"])
    connect_config = polymux.SessionConfig.from_options(**options, **sides["connect"])
    try:
        running: Bridge = await polymux.bridge(
            listen,
            connect,
            names=args.names,
            listen_config=listen_config,
            connect_config=connect_config,
            max_connections=max_connections,
            **server_options(args),
        )
    except OSError as exc:
        print(f"polymux bridge: cannot listen on {listen.where}: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    # The first line says where it listens (scripts wait for it).
    print(
        f"polymux bridge: {running.listen.protocol} on {running.listen.where} -> "
        f"{connect.protocol} on {connect.where} (names: {args.names})",
        flush=True,
    )
    await serve_until_stopped(running, logger)
    stats = running.stats
    print(
        f"polymux bridge: stopped; {stats.sessions} sessions ({stats.connect_failures} without a "
        f"{connect.protocol} session), {stats.channels} channels ({stats.failed} failed), "
        f"{format_bytes(stats.bytes_forward)} across, {format_bytes(stats.bytes_back)} back",
        flush=True,
    )
    return EXIT_OK
