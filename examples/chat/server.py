"""A chat server over polymux: each room is a channel, many clients, TCP and unix
sockets at once, any wire format with two-way channels, and a web page.

    python examples/chat/server.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --unix /tmp/chat.sock
    python examples/chat/server.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --web 127.0.0.1:8000

--web HOST:PORT also serves the page of polymux/apps/web/ (inside the package) over HTTP and its
channels (omnistreams over WebSocket, at /ws) on that port: browsers and terminal
clients meet in the same rooms, and the page uploads files to --files DIR (default:
the folder webchat-files of $XDG_DATA_HOME/polymux, i.e. ~/.local/share/polymux/,
kept from one start to the next) and downloads them from there
(polymux.apps.webchat); /stats.json shows the rooms and the downloads in progress.
The page, its data and its WebSocket answer only requests sent to localhost, a
loopback address or the address the server listens on (against DNS rebinding);
--allow-host NAME adds a name (repeatable), e.g. the machine's name on the LAN.

Each room numbers its messages and keeps its last --history of them: a client that
comes back after a lost connection gets what it missed, once and in order, and is told
how many the room no longer held (polymux.apps.chat).

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
import ipaddress
import json
import os
import signal
import sys
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
)
from polymux.apps.webchat import WEB_PAGE, WebChat
from polymux.web import static_files


PAGE = WEB_PAGE
"""The web page's files (inside the package: ``polymux.apps.webchat.WEB_PAGE``)."""


def default_files() -> Path:
    """Where uploads go without --files: ``$XDG_DATA_HOME/polymux/webchat-files``
    (``~/.local/share/polymux/webchat-files``), the same folder at every start."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "polymux" / "webchat-files"


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
    root = Path(args.files) if args.files else default_files()
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
        process_request=static_files(files, allowed_hosts=allowed_hosts(address, args.allow_host)),
        **session_options(args),
    )
    host = address.host if address.host and ":" not in address.host else f"[{address.host}]"
    print(f"chat: web page on http://{host}:{server.port}/ (files in {web.root})", flush=True)
    if not _loopback_only(address.host):
        extra = ", ".join(args.allow_host) if args.allow_host else "none; add one with --allow-host NAME"
        print(
            "chat: the page answers for localhost and this machine's addresses; other names "
            f"(DNS rebinding) get a 421. Allowed names: {extra}",
            flush=True,
        )
    return server


def allowed_hosts(address: Address, extra: list[str]) -> list[str]:
    """The host names the page answers for besides the loopback names and the address a
    request arrives on: --allow-host, and --web's host when it is a name."""
    names = list(extra)
    host = address.host or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host:
            names.append(host)
    return names


def _loopback_only(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


async def main(args: argparse.Namespace) -> int:
    chat = ChatServer(queue_size=args.queue, policy=args.policy, history=args.history)
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
        "--files",
        metavar="DIR",
        help=f"uploads from the page land here (default: {default_files()}, kept between starts)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer web requests sent to this host name (repeatable; default: loopback names "
        "and the address listened on; '*': any, only behind a proxy that checks Host)",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=100,
        help="recent messages kept per room, for pages that join and clients that come back (default 100)",
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
    if args.history < 0:
        parser.error("--history must be >= 0")
    for name in args.allow_host:
        try:
            static_files({}, allowed_hosts=[name])
        except ValueError:
            parser.error(f"--allow-host: not a host name: {name!r}")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    sys.exit(run(main(arguments), use_uvloop=arguments.uvloop))
