"""Receive files over polymux: listen, and write every file a sender sends into DEST.

    python examples/filetransfer/receive.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --dest inbox/
    python examples/filetransfer/receive.py --protocol yamux --unix /tmp/ft.sock --dest inbox/

One channel per file, SHA-256 verified, partial files kept for resume
(NAME.polymux-part), unsafe names refused (see README.md). Logs one line per file.
Ctrl-C or SIGTERM stops it (exit 0); a receiver that cannot listen exits 1. The first
line says where it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

from polymux.apps.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS,
    add_address_options,
    add_server_options,
    add_session_options,
    conversation_options,
    listen,
    listening_on,
    parse_address,
    run,
    server_options,
    session_options,
    size,
)
from polymux.apps.filetransfer import Receiver


async def main(args: argparse.Namespace) -> int:
    address = parse_address(args.tcp, args.unix)
    receiver = Receiver(Path(args.dest), max_size=args.max_size)
    try:
        options = {**session_options(args), **conversation_options(args.protocol), **server_options(args)}
        server = await listen(address, receiver.handle, args.protocol, **options)
    except OSError as exc:
        print(f"receive: cannot listen on {address}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"receive: {args.protocol} on {listening_on(server, address)}, into {receiver.root}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    await server.wait_closed()
    if address.path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address.path)
    s = receiver.stats
    print(
        f"receive: stopped; {s.files} files received, {s.unchanged} unchanged, {s.refused} refused, "
        f"{s.interrupted} interrupted, {s.failed} failed",
        flush=True,
    )
    return EXIT_OK


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_session_options(parser)
    add_address_options(parser)
    parser.add_argument("--dest", required=True, help="target directory (created if missing)")
    parser.add_argument("--max-size", type=size, metavar="SIZE", help="refuse larger files, e.g. 1GiB")
    add_server_options(parser)
    args = parser.parse_args()
    try:
        parse_address(args.tcp, args.unix)
    except ValueError as exc:
        parser.error(str(exc))
    return args


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(run(main(arguments), use_uvloop=arguments.uvloop))
