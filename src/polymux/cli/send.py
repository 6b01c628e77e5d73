"""polymux send: send files to a polymux receive, many in parallel over one connection, one
channel per file, with progress bars (plain progress lines without a terminal).

    polymux send --protocol mstream-v3 --tcp 127.0.0.1:9000 photos/ notes.txt
    polymux send --protocol yamux --unix /tmp/ft.sock big.iso --as backups/big.iso

A directory sends the files under it (named relative to it). Every file is SHA-256
verified end to end. When the connection is lost it reconnects by itself (--retries, 10 by
default; a jittered backoff of at most 30 s) and resumes every file from what the receiver
has; run it again after it gave up, and only the rest is sent. It prints one summary line: files verified,
bytes sent, seconds, MB/s, how many were resumed, unchanged and failed. Exit status 0 when
every file is verified, 1 when one failed (refused, interrupted, checksum; each is printed
with the receiver's reason) or a PATH cannot be read, 2 for bad arguments, 3 when there is
no session (nothing listens there, or the receiver speaks another wire format).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from polymux.apps.common import (
    EXIT_FAILED,
    EXIT_NO_SESSION,
    EXIT_OK,
    EXIT_STATUS,
    EXIT_USAGE,
    NoSession,
    add_address_options,
    add_session_options,
    check_session_options,
    connect,
    parse_address,
    peer_mismatch,
    run as run_loop,
    session_options,
    size_type,
)


__all__ = ["register", "run", "send"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux send``."""
    parser = sub.add_parser(
        "send",
        help="send files to a polymux receive, one channel per file, with progress bars",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_session_options(parser)
    add_address_options(parser)
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files and directories to send")
    parser.add_argument("--as", dest="as_name", metavar="NAME", help="the name to send a single file under")
    parser.add_argument("--parallel", type=int, default=8, help="files (channels) in flight at once (8)")
    parser.add_argument("--progress", choices=("auto", "rich", "plain", "none"), default="auto")
    parser.add_argument(
        "--limit-rate",
        type=size_type(1024),
        metavar="SIZE",
        help="bytes per second in all, e.g. 10MiB (at least 1KiB)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=10,
        metavar="N",
        help="reconnections after the connection is lost, each resuming every file (10; 0: give up "
        "at the first loss)",
    )
    parser.set_defaults(func=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    """Run ``polymux send``."""
    try:
        parse_address(args.tcp, args.unix)
        check_session_options(args.protocol, session_options(args))
        if args.as_name is not None and len(args.paths) != 1:
            raise ValueError("--as NAME needs exactly one file")
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))
    if args.parallel < 1:
        args.parser.error("--parallel must be >= 1")
    if args.retries < 0:
        args.parser.error("--retries must be >= 0")
    return run_loop(send(args), use_uvloop=args.uvloop)


async def send(args: argparse.Namespace) -> int:
    """Send ``args.paths``; the exit status."""
    from polymux.apps.filetransfer import RateLimiter, collect, send_with_retries, summary

    address = parse_address(args.tcp, args.unix)
    try:
        transfers = collect([Path(p) for p in args.paths], name=args.as_name)
    except OSError as exc:  # a PATH that is not there: an input that cannot be read
        print(f"send: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_FAILED
    except ValueError as exc:  # --as with a directory
        print(f"send: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    limiter = RateLimiter(args.limit_rate) if args.limit_rate else None
    try:
        result = await send_with_retries(
            lambda: connect(address, args.protocol, timeout=30, **session_options(args)),
            transfers,
            retries=args.retries,
            parallel=args.parallel,
            progress=args.progress,
            limiter=limiter,
            give_up=peer_mismatch,
        )
    except NoSession as exc:
        print(f"send: {exc}", file=sys.stderr)
        return EXIT_NO_SESSION
    if result.gave_up is not None:
        print(f"send: no {args.protocol} session with {address}: {result.gave_up}", file=sys.stderr)
        return EXIT_NO_SESSION
    failed = [t for t in transfers if t.status not in ("done", "unchanged")]
    for t in failed:
        print(f"send: error: {t.name!r}: {t.error}", file=sys.stderr)
    line = summary(transfers, result.elapsed, min(args.parallel, len(transfers)), result.reconnects)
    print(f"send: {line}", flush=True)
    return EXIT_FAILED if failed else EXIT_OK
