"""A chat server over polymux: each room is a channel, many clients, TCP and unix
sockets at once, any wire format with two-way channels.

    python examples/chat/server.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --unix /tmp/chat.sock

A slow client never stalls a room: each member has a bounded queue (``--queue``
messages) and its own writer; when the queue is full the ``--policy`` applies:
``disconnect`` (default; the member's channel is reset with the reason and the room is
told) or ``drop`` (that member misses messages and is told how many). One line is logged
per join, leave and slow member. Ctrl-C or SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

import polymux
from polymux.apps.chat import POLICIES, ChatServer
from polymux.apps.common import (
    add_session_options,
    conversation_options,
    listen,
    listening_on,
    parse_address,
    run,
    session_options,
    two_way,
)


async def main(args: argparse.Namespace) -> int:
    chat = ChatServer(queue_size=args.queue, policy=args.policy)
    addresses = [parse_address(args.tcp, None)] if args.tcp else []
    if args.unix:
        addresses.append(parse_address(None, args.unix))
    servers: list[polymux.Server] = []
    try:
        for address in addresses:
            options = {**session_options(args), **conversation_options(args.protocol)}
            server = await listen(address, chat.handle, args.protocol, **options)
            servers.append(server)
            print(f"chat: {args.protocol} on {listening_on(server, address)}", flush=True)
    except OSError as exc:
        print(f"chat: cannot listen: {exc}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()
    for server in servers:
        await server.wait_closed()
    if args.unix:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.unix)
    print(f"chat: stopped; {chat.evicted} slow members disconnected", flush=True)
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_session_options(parser)
    parser.add_argument("--tcp", metavar="HOST:PORT", help="listen on TCP (port 0: any free port)")
    parser.add_argument("--unix", metavar="PATH", help="listen on a unix socket (as well)")
    parser.add_argument("--queue", type=int, default=256, help="messages queued per member (256)")
    parser.add_argument(
        "--policy", choices=POLICIES, default="disconnect", help="for a member whose queue is full"
    )
    args = parser.parse_args()
    if not args.tcp and not args.unix:
        parser.error("give --tcp HOST:PORT and/or --unix PATH")
    try:
        if args.tcp:
            parse_address(args.tcp, None)
        if args.unix:
            parse_address(None, args.unix)
    except ValueError as exc:
        parser.error(str(exc))
    if args.queue < 1:
        parser.error("--queue must be >= 1")
    if not two_way(args.protocol):
        parser.error(f"{args.protocol} channels are one-way; the chat needs two-way channels")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(run(main(arguments), use_uvloop=arguments.uvloop))
