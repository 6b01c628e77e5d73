"""Send files over polymux: many in parallel, one channel each, with progress bars.

    python examples/filetransfer/send.py --protocol mstream-v3 --tcp 127.0.0.1:9000 photos/ notes.txt
    python examples/filetransfer/send.py --protocol yamux --unix /tmp/ft.sock big.iso --as backups/big.iso

A directory sends the files under it (named relative to it). Run it again after an
interruption: the receiver tells how much of each file it has and only the rest is sent.
Exit status: 0 when every file is verified, 1 when one failed (refused, interrupted,
checksum), 2 for bad arguments, 3 when the connection cannot be made.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from polymux import PolymuxError
from polymux.apps.common import (
    add_address_options,
    add_session_options,
    connect,
    parse_address,
    parse_size,
    run,
    session_options,
    two_way,
)
from polymux.apps.filetransfer import RateLimiter, collect, send_with_progress, summary


async def main(args: argparse.Namespace) -> int:
    address = parse_address(args.tcp, args.unix)
    transfers = collect([Path(p) for p in args.paths], name=args.as_name)
    try:
        session = await connect(address, args.protocol, **session_options(args))
    except (OSError, PolymuxError) as exc:
        print(f"send: cannot connect to {address}: {exc}", file=sys.stderr)
        return 3
    limiter = RateLimiter(args.limit_rate) if args.limit_rate else None
    async with session:
        elapsed = await send_with_progress(
            session, transfers, parallel=args.parallel, progress=args.progress, limiter=limiter
        )
    for t in transfers:
        if t.status == "failed":
            print(f"send: error: {t.name!r}: {t.error}", file=sys.stderr)
    print(f"send: {summary(transfers, elapsed, args.parallel)}", flush=True)
    return 0 if all(t.status != "failed" for t in transfers) else 1


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_session_options(parser)
    add_address_options(parser)
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files and directories to send")
    parser.add_argument("--as", dest="as_name", metavar="NAME", help="the name to send a single file under")
    parser.add_argument("--parallel", type=int, default=8, help="files (channels) in flight at once (8)")
    parser.add_argument("--progress", choices=("auto", "rich", "plain", "none"), default="auto")
    parser.add_argument("--limit-rate", type=parse_size, metavar="BYTES", help="bytes per second, in all")
    args = parser.parse_args()
    try:
        parse_address(args.tcp, args.unix)
        collect([Path(p) for p in args.paths], name=args.as_name)
    except ValueError as exc:
        parser.error(str(exc))
    if args.parallel < 1:
        parser.error("--parallel must be >= 1")
    if not two_way(args.protocol):
        parser.error(f"{args.protocol} channels are one-way; the file transfer needs two-way channels")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    try:
        sys.exit(run(main(arguments), use_uvloop=arguments.uvloop))
    except KeyboardInterrupt:
        sys.exit(130)  # Ctrl-C: the connection is dropped; the receiver keeps what it has
