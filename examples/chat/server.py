"""A chat server over polymux: each room is a channel, many clients, TCP and unix
sockets at once, any wire format with two-way channels, and a web page.

    python examples/chat/server.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --unix /tmp/chat.sock
    python examples/chat/server.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --web 127.0.0.1:8000

--web HOST:PORT also serves the page of examples/chat/web/ over HTTP and its
channels (omnistreams over WebSocket, at /ws) on that port: browsers and terminal
clients meet in the same rooms, and the page uploads files to --files DIR and
downloads them from there (polymux.apps.webchat); /stats.json shows the rooms and
the downloads in progress.

A slow client never stalls a room: each member has a bounded queue (--queue
messages) and its own writer; when the queue is full the --policy applies:
disconnect (default; the member's channel is reset with the reason and the room is
told) or drop (that member misses messages and is told how many). One line is logged
per join, leave and slow member. Ctrl-C or SIGTERM stops it (exit 0); a server that
cannot listen exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import polymux
from polymux.apps.chat import POLICIES, ChatServer
from polymux.apps.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS,
    Address,
    add_session_options,
    conversation_options,
    listen,
    listening_on,
    parse_address,
    run,
    session_options,
    size,
    two_way,
)
from polymux.apps.webchat import WebChat
from polymux.web import static_files


PAGE = Path(__file__).resolve().parent / "web"
"""The web page's files."""


def terminal_hint(args: argparse.Namespace, where: Address) -> str:
    """How a terminal client joins the rooms the page shows."""
    python = os.path.relpath(sys.executable)
    python = sys.executable if python.startswith("..") else python
    return (
        f"chat: terminal clients join with: {python} examples/chat/client.py "
        f"--protocol {args.protocol} --tcp {where.host}:{where.port} --nick NAME --room lobby"
    )


async def serve_web(chat: ChatServer, address: Address, args: argparse.Namespace) -> polymux.Server:
    """The page and its channels on one port: HTTP GETs get the page's files, the
    WebSocket at /ws carries omnistreams."""
    root = Path(args.files) if args.files else Path(tempfile.mkdtemp(prefix="polymux-webchat-"))
    web = WebChat(chat, root, max_upload=args.max_upload)
    files = {"/": PAGE / "index.html", "/stats.json": lambda: json.dumps(web.stats()).encode()}
    for path in sorted(PAGE.iterdir()):
        if path.suffix in (".js", ".css"):
            files["/" + path.name] = path
    server = await polymux.serve_websocket(
        web.handle,
        address.host,
        address.port,
        protocol="omnistreams",
        process_request=static_files(files),
        **session_options(args),
    )
    host = address.host if address.host and ":" not in address.host else f"[{address.host}]"
    print(f"chat: web page on http://{host}:{server.port}/ (files in {web.root})", flush=True)
    return server


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
        if args.web:
            servers.append(await serve_web(chat, parse_address(args.web, None), args))
            if args.tcp:
                print(
                    terminal_hint(args, listening_on(servers[0], parse_address(args.tcp, None))), flush=True
                )
    except OSError as exc:
        print(f"chat: cannot listen: {exc}", file=sys.stderr)
        return EXIT_FAILED
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
    return EXIT_OK


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_session_options(parser)
    parser.add_argument("--tcp", metavar="HOST:PORT", help="listen on TCP (port 0: any free port)")
    parser.add_argument("--unix", metavar="PATH", help="listen on a unix socket (as well)")
    parser.add_argument(
        "--web", metavar="HOST:PORT", help="serve the web page and its WebSocket (omnistreams) there too"
    )
    parser.add_argument(
        "--files", metavar="DIR", help="uploads from the page land here (default: a new temporary folder)"
    )
    parser.add_argument(
        "--max-upload", type=size, default=None, metavar="SIZE", help="largest upload (e.g. 1GiB)"
    )
    parser.add_argument("--queue", type=int, default=256, help="messages queued per member (default 256)")
    parser.add_argument(
        "--policy", choices=POLICIES, default="disconnect", help="for a member whose queue is full"
    )
    args = parser.parse_args()
    if not args.tcp and not args.unix and not args.web:
        parser.error("give --tcp HOST:PORT, --unix PATH and/or --web HOST:PORT")
    try:
        if args.web:
            try:
                parse_address(args.web, None)
            except ValueError as exc:
                parser.error(str(exc).replace("--tcp", "--web"))
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
