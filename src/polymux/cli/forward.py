"""polymux forward: TCP port forwarding (-L, -R) and a SOCKS5 proxy (-D) over one
multiplexed connection, in any wire format, over TCP, a unix socket, TLS or a WebSocket.

The far end (the side that connects to targets):

  polymux forward --listen 0.0.0.0:4000 --allow 127.0.0.1:22 --allow '10.0.0.0/8:*'
  polymux forward --listen 127.0.0.1:4000 --to 127.0.0.1:5432     # bare channels (kcptun's way)

The near end (the side users connect to), ssh's syntax:

  polymux forward --connect far.example:4000 -L 2222:127.0.0.1:22 -D 1080 -R 8080:127.0.0.1:80

-L [BIND:]PORT:HOST:HOSTPORT listens here; each connection is a channel whose far end
connects to HOST:HOSTPORT (if --allow allows it). -L [BIND:]PORT alone opens bare
channels (no bytes of polymux's own): the far end's --to target, or any yamux or smux
server that maps streams to one target. -R [BIND:]PORT:HOST:HOSTPORT listens on the far
end (started with --reverse) and connects here. -D [BIND:]PORT is a SOCKS5 server (no
authentication; CONNECT to IPv4, IPv6 and names, resolved by the far end). BIND is
127.0.0.1 unless given ('*' for every address); PORT 0 picks a free port.

With no --allow and no --to, the far end refuses every target (an open proxy is never
the default). On formats without channel names (yamux, smux, Streamux) a far end with
--to takes every channel as bare, so --to there excludes --allow and --reverse.

Each listener prints one line on stdout when ready, with its real address ("listening -L
127.0.0.1:41234 -> 127.0.0.1:80"; the far end "listening 127.0.0.1:4000"). One line per
connection goes to stderr when it ends (target, bytes each way, seconds, how it ended;
--quiet keeps only those that did not end well). The near end reconnects with a jittered
backoff (up to --reconnect-max seconds) when the connection is lost; connections in
flight then are closed, new ones wait for the session (10 s at most). Ctrl-C or SIGTERM:
both ends stop accepting, let open connections finish for --grace seconds, close, print a
summary and exit 0. A far end that cannot listen exits 1; a near end whose first
connection fails, or whose peer is not a far end, exits 3; one whose -R is refused, or
that cannot listen locally, exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import ssl
import sys
from typing import Any

import polymux
from polymux import formats
from polymux.apps.common import (
    EXIT_FAILED,
    EXIT_NO_SESSION,
    EXIT_OK,
    EXIT_STATUS,
    MIN_SESSION_MEMORY,
    MIN_WINDOW,
    Address,
    NoSession,
    add_liveness_options,
    connect as connect_diagnosed,
    diagnosing_capture,
    format_bytes,
    liveness_options,
    peer_mismatch,
    run as run_loop,
    seconds,
    serve_until_stopped,
    size_type,
)
from polymux.bridging import Endpoint, connect_endpoint
from polymux.forward import (
    MAX_REVERSE,
    REVERSE_MODES,
    AllowList,
    Backoff,
    FarEnd,
    ForwardError,
    ForwardStats,
    NearEnd,
    NotAForwarder,
    parse_host_port,
    start_far_end,
    start_near_end,
)
from polymux.forward.common import stats_every


__all__ = ["register", "run"]

logger = logging.getLogger("polymux.forward")

DEFAULT_PROTOCOL = "yamux"
"""The format when --protocol is not given: credit, keepalive pings, and Go peers."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux forward``."""
    parser = sub.add_parser(
        "forward",
        help="TCP port forwarding (-L, -R) and a SOCKS5 proxy (-D) over one connection",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--listen",
        metavar="ADDRESS",
        help="be the far end, listening on HOST:PORT, unix:PATH or ws://HOST:PORT/PATH (port 0: any free port)",
    )
    where.add_argument(
        "--connect",
        metavar="ADDRESS",
        help="be the near end, connecting to HOST:PORT, unix:PATH, ws://HOST:PORT/PATH or wss://...",
    )
    parser.add_argument(
        "--protocol",
        default=DEFAULT_PROTOCOL,
        choices=polymux.PROTOCOLS,
        metavar="PROTOCOL",
        help=f"wire format, the same on both ends (default {DEFAULT_PROTOCOL}): {', '.join(polymux.PROTOCOLS)}",
    )
    far = parser.add_argument_group("the far end (--listen)")
    far.add_argument(
        "--to", metavar="HOST:PORT", help="where bare channels go (-L PORT, Go yamux/smux clients)"
    )
    far.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="SPEC",
        help="a target requests may name: HOST:PORT, HOST:*, *:PORT, CIDR:PORT (10.0.0.0/8:22, "
        "[fd00::/8]:*), a port range (HOST:8000-8099) or * (repeatable; none: every target refused)",
    )
    far.add_argument(
        "--reverse",
        nargs="?",
        const="loopback",
        default="off",
        choices=REVERSE_MODES,
        metavar="WHERE",
        help="let near ends listen here (-R): on loopback addresses (--reverse), or on any (--reverse any)",
    )
    far.add_argument(
        "--max-reverse",
        type=int,
        default=MAX_REVERSE,
        metavar="N",
        help=f"-R listeners one near end may hold at once (default {MAX_REVERSE})",
    )
    far.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate chain (PEM)")
    far.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    far.add_argument(
        "--connect-timeout",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="seconds a connection to a target may take (default 10)",
    )
    near = parser.add_argument_group("the near end (--connect)")
    near.add_argument(
        "-L",
        dest="local",
        action="append",
        default=[],
        metavar="SPEC",
        help="[BIND:]PORT:HOST:HOSTPORT or [BIND:]PORT",
    )
    near.add_argument(
        "-R", dest="remote", action="append", default=[], metavar="SPEC", help="[BIND:]PORT:HOST:HOSTPORT"
    )
    near.add_argument(
        "-D", dest="socks", action="append", default=[], metavar="SPEC", help="[BIND:]PORT: a SOCKS5 server"
    )
    near.add_argument("--tls", action="store_true", help="connect with TLS (the system's CAs, or --tls-ca)")
    near.add_argument(
        "--tls-ca", metavar="FILE", help="trust this CA or self-signed certificate (implies --tls)"
    )
    near.add_argument(
        "--tls-server-name", metavar="NAME", help="the name the certificate must have (default the host)"
    )
    near.add_argument(
        "--reconnect-max",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="longest wait between attempts to reconnect (default 30; the first is 0.5, doubling, jittered)",
    )
    both = parser.add_argument_group("both ends")
    both.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        metavar="N",
        help="forwarded connections at once, more are refused (default 1024; the far end also holds "
        "at most N sessions)",
    )
    both.add_argument(
        "--grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="on Ctrl-C or SIGTERM, seconds open connections may take to finish (default 5)",
    )
    both.add_argument("--quiet", action="store_true", help="no line for connections that ended well")
    both.add_argument("--stats", type=seconds, metavar="SECONDS", help="print a statistics line this often")
    both.add_argument(
        "--window",
        type=size_type(MIN_WINDOW),
        metavar="SIZE",
        help="receive window per channel (SessionConfig.receive_window), e.g. 256KiB; at least 4KiB",
    )
    both.add_argument(
        "--max-session-memory",
        type=size_type(MIN_SESSION_MEMORY),
        metavar="SIZE",
        help="per-session budget of unread + unsent bytes, e.g. 32MiB (default 32MiB; at least 64KiB)",
    )
    both.add_argument("--uvloop", action="store_true", help="run on uvloop")
    add_liveness_options(
        both,
        handshake_help="seconds a session may take to connect and complete its handshake, a far end's new "
        "connection to send its first frame, and a channel its request line (default 10)",
        idle_help="seconds a session with no channels may go without a frame before the far end closes it, "
        "or off (default 300)",
    )
    parser.set_defaults(func=run, parser=parser)


def _endpoint(option: str, text: str, protocol: str) -> Endpoint:
    """``--listen``/``--connect``'s address as an endpoint of ``protocol``."""
    spec = text if text.startswith(("ws://", "wss://", "unix:", "tcp:")) else f"tcp:{text}"
    try:
        endpoint = Endpoint.parse(f"{protocol}:{spec}")
    except ValueError:
        raise ValueError(
            f"{option} {text!r}: expected HOST:PORT (an IPv6 host in brackets), unix:PATH or ws://HOST:PORT/PATH"
        ) from None
    if option == "--connect" and endpoint.transport != "unix" and endpoint.port == 0:
        raise ValueError(f"--connect {text!r}: a port is needed to connect")
    if option == "--listen" and endpoint.transport == "ws" and str(endpoint.uri).startswith("wss:"):
        raise ValueError(f"--listen {text!r}: listen on ws:// with --tls-cert and --tls-key to serve wss://")
    return endpoint


def _check(args: argparse.Namespace) -> None:
    """Refuse options of the other end, and what cannot work (ValueError)."""
    far_only = {
        "--to": args.to is not None,
        "--allow": bool(args.allow),
        "--reverse": args.reverse != "off",
        "--max-reverse": args.max_reverse != MAX_REVERSE,
        "--tls-cert": args.tls_cert is not None,
        "--tls-key": args.tls_key is not None,
    }
    near_only = {
        "-L": bool(args.local),
        "-R": bool(args.remote),
        "-D": bool(args.socks),
        "--tls": args.tls,
        "--tls-ca": args.tls_ca is not None,
        "--tls-server-name": args.tls_server_name is not None,
    }
    if args.listen is not None:
        wrong = [name for name, given in near_only.items() if given]
        if wrong:
            raise ValueError(
                f"{', '.join(wrong)}: options of the near end (--connect), not of a far end (--listen)"
            )
        if (args.tls_cert is None) != (args.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if args.to is not None:
            parse_host_port(args.to, "--to")
        AllowList.parse(args.allow)
    else:
        wrong = [name for name, given in far_only.items() if given]
        if wrong:
            raise ValueError(
                f"{', '.join(wrong)}: options of the far end (--listen), not of a near end (--connect)"
            )
        if not (args.local or args.remote or args.socks):
            raise ValueError("--connect: give at least one -L, -R or -D")
    if args.max_connections <= 0:
        raise ValueError(f"--max-connections must be positive, got {args.max_connections}")
    if args.max_reverse < 0:
        raise ValueError(f"--max-reverse must be 0 or more, got {args.max_reverse}")
    if args.grace < 0:
        raise ValueError(f"--grace must be 0 or more seconds, got {args.grace:g}")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """SessionConfig fields from the arguments."""
    options: dict[str, Any] = {}
    if args.window is not None:
        options["receive_window"] = args.window
    if args.max_session_memory is not None:
        options["max_session_memory"] = args.max_session_memory
    options.update(liveness_options(args))
    return options


def run(args: argparse.Namespace) -> int:
    """Run ``polymux forward``."""
    try:
        _check(args)
        endpoint = _endpoint(
            "--listen" if args.listen is not None else "--connect", args.listen or args.connect, args.protocol
        )
        options = _options(args)
        polymux.SessionConfig.from_options(**options)
        if args.listen is None:
            from polymux.forward import Forward

            for kind, specs in (("L", args.local), ("R", args.remote), ("D", args.socks)):
                for spec in specs:
                    Forward.parse(kind, spec)
        elif (
            args.to is not None
            and not formats.get(args.protocol).caps.names
            and (args.allow or args.reverse != "off")
        ):
            raise ValueError(
                f"--to with --allow or --reverse on {args.protocol}: its channels carry no names, so with "
                "--to every channel is bare; use a format with names (--protocol mstream-v3, mplex ...) "
                "or run two far ends"
            )
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))
    try:
        context = _tls_context(args)
    except (OSError, ssl.SSLError) as exc:
        print(f"polymux forward: cannot load the TLS files: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    if args.quiet:
        logger.setLevel(logging.WARNING)
    main = (
        _far(args, endpoint, options, context)
        if args.listen is not None
        else _near(args, endpoint, options, context)
    )
    return run_loop(main, use_uvloop=args.uvloop)


def _tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if args.tls_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        return context
    if args.tls or args.tls_ca is not None or str(args.connect or "").startswith("wss:"):
        return ssl.create_default_context(cafile=args.tls_ca)
    return None


async def _run_until_stopped(
    end: FarEnd | NearEnd, stats: ForwardStats, args: argparse.Namespace, lines: list[str]
) -> None:
    def ready() -> None:
        for line in lines:  # once Ctrl-C and SIGTERM are ours: scripts may signal after them
            print(line, flush=True)

    ticker = None
    if args.stats is not None:
        ticker = asyncio.ensure_future(
            stats_every(args.stats, stats, lambda line: print(f"polymux forward: {line}", flush=True))
        )
    try:
        await serve_until_stopped(end, logger, grace=args.grace, ready=ready)
    finally:
        if ticker is not None:
            ticker.cancel()
    print(
        f"polymux forward: stopped; {stats.total} connections ({stats.refused} refused, {stats.failed} failed), "
        f"{format_bytes(stats.bytes_out)} out, {format_bytes(stats.bytes_back)} back",
        flush=True,
    )


async def _far(
    args: argparse.Namespace, endpoint: Endpoint, options: dict[str, Any], context: ssl.SSLContext | None
) -> int:
    def not_a_session(peer: str, why: str) -> None:
        logger.warning("connection from %s: no %s session: %s", peer, args.protocol, why)

    try:
        far = await start_far_end(
            endpoint,
            to=args.to,
            allow=args.allow,
            reverse=args.reverse,
            max_reverse=args.max_reverse,
            max_connections=args.max_connections,
            connect_timeout=args.connect_timeout,
            ssl=context,
            capture=diagnosing_capture(args.protocol, not_a_session),
            **options,
        )
    except OSError as exc:
        print(f"polymux forward: cannot listen on {args.listen}: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    targets = []
    if far.to is not None:
        targets.append(f"bare channels to {far.to}")
    if far.allow:
        targets.append(f"requests to {far.allow}")
    if not targets:
        logger.warning("no --allow and no --to: every target is refused")
    else:
        logger.info("%s over %s: %s; -R %s", args.protocol, far.address, "; ".join(targets), far.reverse)
    await _run_until_stopped(far, far.stats, args, [f"listening {far.address}"])  # the first line
    return EXIT_OK


async def _near(
    args: argparse.Namespace, endpoint: Endpoint, options: dict[str, Any], context: ssl.SSLContext | None
) -> int:
    cfg = polymux.SessionConfig.from_options(**options)
    option = formats.get(args.protocol).caps.conversation_option
    if option is not None:
        cfg = polymux.SessionConfig.from_options(cfg, **{option: True})

    async def factory(handler: Any) -> polymux.Session:
        if endpoint.transport == "ws":
            try:
                async with asyncio.timeout(cfg.handshake_timeout):
                    return await connect_endpoint(
                        endpoint,
                        config=cfg,
                        handler=handler,
                        ssl=context,
                        server_hostname=args.tls_server_name,
                    )
            except (OSError, polymux.PolymuxError, TimeoutError) as exc:
                raise NoSession(
                    f"cannot connect to {endpoint.where} ({args.protocol}): {exc or 'timed out'}"
                ) from None
        address = (
            Address(path=endpoint.path)
            if endpoint.transport == "unix"
            else Address(endpoint.host, endpoint.port)
        )
        tls: dict[str, Any] = {}
        if context is not None:
            name = args.tls_server_name or (endpoint.host if endpoint.transport == "tcp" else "localhost")
            tls = {"ssl": context, "server_hostname": name}
        return await connect_diagnosed(
            address, args.protocol, timeout=cfg.handshake_timeout, config=cfg, handler=handler, **tls
        )

    try:
        near = await start_near_end(
            factory,
            local=args.local,
            remote=args.remote,
            socks=args.socks,
            max_connections=args.max_connections,
            backoff=Backoff(initial=min(0.5, args.reconnect_max), maximum=args.reconnect_max),
        )
    except NoSession as exc:
        print(f"polymux forward: {exc}", file=sys.stderr, flush=True)
        return EXIT_NO_SESSION
    except NotAForwarder as exc:
        why = peer_mismatch(exc.session) if exc.session is not None else None
        print(f"polymux forward: {endpoint.where}: {why or exc}", file=sys.stderr, flush=True)
        return EXIT_NO_SESSION
    except ForwardError as exc:
        print(f"polymux forward: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except OSError as exc:
        print(f"polymux forward: cannot listen: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    logger.info("connected to %s (%s)", endpoint.where, args.protocol)
    await _run_until_stopped(near, near.stats, args, [f"listening {fwd.describe()}" for fwd in near.forwards])
    return EXIT_OK
