"""polymux receive: listen, and write every file a polymux send sends into --dest.

    polymux receive --protocol mstream-v3 --tcp 127.0.0.1:9000 --dest inbox/
    polymux receive --protocol yamux --unix /tmp/ft.sock --dest inbox/

One channel per file, SHA-256 verified, partial files kept for resume (NAME.polymux-part),
unsafe names refused: absolute paths, '..', empty components, control characters, names
ending in .polymux-part; the resolved path must stay inside --dest (symlinks followed).
Logs one line per file (received, unchanged, refused, interrupted, failed). The first line
says where it listens (with the real port for --tcp HOST:0). Ctrl-C or SIGTERM stops it
(exit 0); a receiver that cannot listen exits 1.
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
    check_session_options,
    conversation_options,
    listen,
    listening_on,
    parse_address,
    run as run_loop,
    server_options,
    session_options,
    size,
)


__all__ = ["receive", "register", "run"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux receive``."""
    parser = sub.add_parser(
        "receive",
        help="receive files from polymux send into a folder (SHA-256, resume, safe paths)",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_session_options(parser)
    add_address_options(parser)
    parser.add_argument("--dest", required=True, help="target directory (created if missing)")
    parser.add_argument("--max-size", type=size, metavar="SIZE", help="refuse larger files, e.g. 1GiB")
    add_server_options(parser)
    parser.set_defaults(func=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    """Run ``polymux receive``."""
    try:
        parse_address(args.tcp, args.unix)
        check_session_options(args.protocol, session_options(args))
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))
    return run_loop(receive(args), use_uvloop=args.uvloop)


async def receive(args: argparse.Namespace) -> int:
    """Receive until Ctrl-C or SIGTERM; the exit status."""
    from polymux.apps.filetransfer import Receiver

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
