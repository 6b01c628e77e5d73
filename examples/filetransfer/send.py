"""Send files over polymux: many in parallel, one channel each, with progress bars.

    python examples/filetransfer/send.py --protocol mstream-v3 --tcp 127.0.0.1:9000 photos/ notes.txt
    python examples/filetransfer/send.py --protocol yamux --unix /tmp/ft.sock big.iso --as backups/big.iso

A directory sends the files under it (named relative to it). When the connection is lost
it reconnects by itself (--retries, 10 by default; jittered backoff of at most 30 s) and
resumes every file from what the receiver has; run it again after it gave up, and only
the rest is sent. Exit status (the table of every polymux command): 0 when every file is
verified, 1 when one failed (refused, interrupted, checksum) or a PATH cannot be read, 2
for bad arguments, 3 when there is no session (nothing listens there, or the receiver
speaks another wire format).
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
    connect,
    parse_address,
    peer_mismatch,
    run,
    session_options,
    size_type,
)
from polymux.apps.filetransfer import DEFAULT_RETRIES, RateLimiter, collect, send_with_retries, summary


async def main(args: argparse.Namespace) -> int:
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
    failed = [t for t in transfers if t.status != "done" and t.status != "unchanged"]
    for t in failed:
        print(f"send: error: {t.name!r}: {t.error}", file=sys.stderr)
    line = summary(transfers, result.elapsed, min(args.parallel, len(transfers)), result.reconnects)
    print(f"send: {line}", flush=True)
    return EXIT_FAILED if failed else EXIT_OK


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_session_options(parser)
    add_address_options(parser)
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files and directories to send")
    parser.add_argument("--as", dest="as_name", metavar="NAME", help="the name to send a single file under")
    parser.add_argument("--parallel", type=int, default=8, help="files (channels) in flight at once (8)")
    parser.add_argument("--progress", choices=("auto", "rich", "plain", "none"), default="auto")
    parser.add_argument(
        "--retries",
        type=int,
        default=DEFAULT_RETRIES,
        metavar="N",
        help=f"reconnections after the connection is lost, each resuming every file "
        f"({DEFAULT_RETRIES}; 0: give up at the first loss)",
    )
    parser.add_argument(
        "--limit-rate",
        type=size_type(1024),
        metavar="SIZE",
        help="bytes per second in all, e.g. 10MiB (at least 1KiB)",
    )
    args = parser.parse_args()
    try:
        parse_address(args.tcp, args.unix)
        if args.as_name is not None and len(args.paths) != 1:
            raise ValueError("--as NAME needs exactly one file")
    except ValueError as exc:
        parser.error(str(exc))
    if args.parallel < 1:
        parser.error("--parallel must be >= 1")
    if args.retries < 0:
        parser.error("--retries must be >= 0")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    try:
        sys.exit(run(main(arguments), use_uvloop=arguments.uvloop))
    except KeyboardInterrupt:
        sys.exit(130)  # Ctrl-C: the connection is dropped; the receiver keeps what it has
