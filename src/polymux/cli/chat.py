"""polymux chat: the chat's terminal client, one channel per room joined; with --server,
the chat server (rooms as channels, TCP and unix sockets at once, optionally its web page).

    polymux chat --nick ada --room lobby                 # joins a local polymux webchat
    polymux chat --protocol yamux --unix /tmp/chat.sock --nick bob --room lobby --room dev
    polymux chat --server --protocol yamux --tcp 127.0.0.1:9000 --unix /tmp/chat.sock

The client is interactive by default: each line of stdin is a message to the first room (a
line "#room text" goes to another joined room); end of input leaves. Scripted use (tests,
load): --say TEXT sends lines, --send N --size BYTES sends N generated messages, --expect N
waits for N messages from others, --until TEXT for someone to say TEXT, and
--pause-reading-after N stops reading after N messages until the process gets SIGUSR1 (a
slow client). It connects to --tcp HOST:PORT (default 127.0.0.1:9000, where polymux
webchat takes terminal clients) or --unix PATH, in --protocol (default mstream-v3).

The server (--server) listens on --tcp and/or --unix, any wire format with two-way
channels; --web HOST:PORT also serves the web page (what polymux webchat starts). A slow
client never stalls a room: each member has a bounded queue (--queue messages) and its own
writer; when the queue is full the --policy applies: disconnect (default; the member's
channel is reset with the reason and the room is told) or drop (that member misses messages
and is told how many). One line is logged per join, leave and slow member. Ctrl-C or
SIGTERM stops it (exit 0); a server that cannot listen exits 1.

Exit status of the client: 0 after leaving normally; 1 when a join is refused or the server
disconnects us (e.g. the slow-client policy); 2 for bad arguments; 3 when there is no
session (nothing listens there, or the server speaks another wire format).
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polymux
from polymux import PolymuxError
from polymux._extras import require
from polymux.apps.chat import POLICIES, ChatClient, ChatServer
from polymux.apps.common import (
    EXIT_FAILED,
    EXIT_NO_SESSION,
    EXIT_OK,
    EXIT_STATUS,
    Address,
    NoSession,
    add_server_options as add_limit_options,
    add_session_options,
    check_session_options,
    connect,
    conversation_options,
    format_bytes,
    listen,
    listening_on,
    parse_address,
    peer_mismatch,
    run as run_loop,
    server_options,
    session_options,
    size,
)
from polymux.apps.records import RecordError


__all__ = [
    "CLIENT_OPTIONS",
    "DEFAULT_PROTOCOL",
    "DEFAULT_TCP",
    "SERVER_OPTIONS",
    "add_client_options",
    "add_server_options",
    "check_client_args",
    "check_server_args",
    "default_files",
    "register",
    "run",
    "run_client",
    "run_server",
]

DEFAULT_PROTOCOL = "mstream-v3"
"""The wire format of ``polymux chat`` and ``polymux webchat`` when --protocol is not given."""

DEFAULT_TCP = "127.0.0.1:9000"
"""Where ``polymux webchat`` takes terminal clients, and where ``polymux chat`` connects,
unless told otherwise."""

CLIENT_OPTIONS = ("nick", "room", "say", "send", "size", "expect", "until", "pause_reading_after", "quiet")
"""The options of the client alone (refused with --server)."""

SERVER_OPTIONS = (
    "web",
    "files",
    "allow_host",
    "history",
    "max_upload",
    "queue",
    "policy",
    "max_memory",
    "max_connections_per_address",
)
"""The options of the server alone (refused without --server)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux chat``."""
    parser = sub.add_parser(
        "chat",
        help="the chat's terminal client (rooms as channels); --server: the chat server",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--server", action="store_true", help="run the chat server instead of a client (see below)"
    )
    add_session_options(parser, default=DEFAULT_PROTOCOL)
    parser.add_argument(
        "--tcp",
        metavar="HOST:PORT",
        help=f"client: the server's TCP address (default {DEFAULT_TCP}); server: listen there "
        "(port 0: any free port)",
    )
    parser.add_argument(
        "--unix", metavar="PATH", help="client: the server's unix socket; server: listen there too"
    )
    add_client_options(parser.add_argument_group("client"))
    add_server_options(parser.add_argument_group("server (with --server)"))
    parser.set_defaults(func=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    """Run ``polymux chat``: the server with --server, else the client."""
    try:
        check_session_options(args.protocol, session_options(args))
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))
    if args.server:
        check_server_args(args.parser, args, given=_given(args, CLIENT_OPTIONS), mode="--server")
        if args.web:
            require(
                "websockets", "polymux chat --web"
            )  # before listening: one line, not a half-started server
        return run_loop(run_server(args), use_uvloop=args.uvloop)
    unwanted = _given(args, SERVER_OPTIONS)
    if unwanted:
        args.parser.error(f"{unwanted[0]} is an option of the server: add --server, or leave it out")
    check_client_args(args.parser, args)
    return run_loop(run_client(args), use_uvloop=args.uvloop)


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    """The options among ``names`` given on the command line, as spelled there (their
    defaults are ``None`` in the parser, and filled in by the check of their mode)."""
    return ["--" + name.replace("_", "-") for name in names if getattr(args, name, None) is not None]


def _fill(args: argparse.Namespace, defaults: dict[str, Any]) -> None:
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


# -- the client ---------------------------------------------------------------------------


def add_client_options(group: argparse._ActionsContainer) -> None:
    """The client's own options (--nick, --room, the scripted-use options)."""
    group.add_argument("--nick", help="your nick (required for the client)")
    group.add_argument("--room", action="append", help="room to join (repeatable; default lobby)")
    group.add_argument("--say", action="append", metavar="TEXT", help="send TEXT (repeatable)")
    group.add_argument("--send", type=int, metavar="N", help="send N generated messages, wait for their echo")
    group.add_argument("--size", type=size, metavar="SIZE", help="bytes per generated message (default 64)")
    group.add_argument("--expect", type=int, metavar="N", help="leave after N messages from others")
    group.add_argument("--until", metavar="TEXT", help="leave once someone says TEXT")
    group.add_argument("--pause-reading-after", type=int, metavar="N", help="stop reading after N messages")
    group.add_argument("--quiet", action="store_true", default=None, help="do not print messages")


def check_client_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Complete and check the client's arguments (``parser.error`` on bad ones)."""
    if not args.nick:
        parser.error("the client needs --nick NAME")
    _fill(args, {"room": ["lobby"], "say": [], "size": 64, "quiet": False})
    if args.tcp is not None and args.unix is not None:
        parser.error("give --tcp HOST:PORT or --unix PATH, not both")
    if args.tcp is None and args.unix is None:
        args.tcp = DEFAULT_TCP
    try:
        parse_address(args.tcp, args.unix)
    except ValueError as exc:
        parser.error(str(exc))


class _State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.own = 0
        self.others = 0
        self.own_done = asyncio.Event()
        self.others_done = asyncio.Event()
        self.resume = asyncio.Event()
        self.until = asyncio.Event()
        self.disconnected: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def show(self, line: str) -> None:
        print(line, flush=True)


async def _read_room(client: ChatClient, room: str, state: _State) -> None:
    args = state.args
    received = 0
    paused = False
    try:
        while True:
            if args.pause_reading_after is not None and received == args.pause_reading_after and not paused:
                paused = True
                state.show(f"paused reading #{room} after {received} messages (SIGUSR1 resumes)")
                await state.resume.wait()
                state.show(f"resumed reading #{room}")
            record = await client.read(room)
            if record is None:
                state.show(f"the server closed #{room}")
                break
            kind = record["type"]
            if kind == "msg":
                received += 1
                if record.get("nick") == client.nick:
                    state.own += 1
                    if args.send is None or state.own >= args.send + len(args.say):
                        state.own_done.set()
                else:
                    state.others += 1
                    if args.expect is not None and state.others >= args.expect:
                        state.others_done.set()
                    if args.until is not None and record.get("text") == args.until:
                        state.until.set()
                if not args.quiet:
                    state.show(f"[#{room}] {record.get('nick')}: {record.get('text')}")
            elif kind == "joined":
                state.show(f"* {record.get('nick')} joined #{room}")
            elif kind == "left":
                reason = record.get("reason")
                why = f" ({reason})" if reason and reason != "left" else ""
                state.show(f"* {record.get('nick')} left #{room}{why}")
            elif kind == "renamed":
                state.show(f"* {record.get('old')} is now {record.get('nick')} in #{room}")
            elif kind == "file":
                state.show(
                    f"* {record.get('nick')} put {record.get('name')} ({format_bytes(record.get('size', 0))}) "
                    f"on the server, in #{room}"
                )
            elif kind == "dropped":
                state.show(
                    f"* the server dropped {record.get('count')} messages and {record.get('notices')} "
                    f"notices of #{room} for us (too slow)"
                )
            elif kind == "error":
                state.show(f"* error from the server: {record.get('message')}")
    except (ConnectionError, PolymuxError, RecordError) as exc:
        if not state.disconnected.done():
            state.disconnected.set_result(f"disconnected from #{room}: {exc}")


async def _interactive(client: ChatClient, rooms: list[str], state: _State) -> None:
    loop = asyncio.get_running_loop()
    sent = 0
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        text = line.rstrip("\n")
        room = rooms[0]
        if text.startswith("#") and " " in text and text[1:].split(" ", 1)[0] in rooms:
            room, text = text[1:].split(" ", 1)
        if text.strip():  # the server refuses blank messages
            await client.say(room, text)
            sent += 1
    # End of input: leave once what we said has come back (it reached the room).
    while state.own < sent:
        state.own_done.clear()
        await state.own_done.wait()


async def _send_all(client: ChatClient, room: str, args: argparse.Namespace) -> None:
    for text in args.say:
        await client.say(room, text)
    for i in range(args.send or 0):
        prefix = f"{args.nick} message {i} "
        await client.say(room, prefix + "." * max(0, args.size - len(prefix)))


async def run_client(args: argparse.Namespace) -> int:
    """The client: join ``args.room`` as ``args.nick``, then talk (interactive or scripted);
    the exit status."""
    state = _State(args)
    address = parse_address(args.tcp, args.unix)
    try:
        session = await connect(address, args.protocol, timeout=30, **session_options(args))
    except NoSession as exc:
        print(f"chat: {exc}", file=sys.stderr)
        return EXIT_NO_SESSION
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, state.resume.set)
    async with session:
        client = ChatClient(session, args.nick)
        readers = []
        for room in args.room:
            try:
                welcome = await client.join(room)
            except ValueError as exc:  # refused by the server (a nick in use ...)
                print(f"chat: {exc}", file=sys.stderr)
                return EXIT_FAILED
            except (ConnectionError, PolymuxError, RecordError) as exc:
                if (why := peer_mismatch(session)) is not None:
                    print(f"chat: no {args.protocol} session with {address}: {why}", file=sys.stderr)
                    return EXIT_NO_SESSION
                print(f"chat: cannot join #{room}: {exc}", file=sys.stderr)
                return EXIT_FAILED
            state.show(f"joined #{room} as {args.nick}; members: {', '.join(welcome.get('members', []))}")
            readers.append(asyncio.create_task(_read_room(client, room, state)))
        goals: list[Any] = []
        if args.send is not None or args.say:
            args.send = args.send or 0
            goals.append(state.own_done.wait())
        if args.expect is not None:
            goals.append(state.others_done.wait())
        if args.until is not None:
            goals.append(state.until.wait())
        first = args.room[0]
        work = asyncio.ensure_future(
            _send_all(client, first, args) if goals else _interactive(client, args.room, state)
        )
        done = asyncio.gather(work, *goals)
        waits: set[asyncio.Future[Any]] = {done, state.disconnected}
        finished, _pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if state.disconnected in finished:
            done.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await done
            for task in readers:
                task.cancel()
            state.show(f"chat: {state.disconnected.result()}")
            session.abort()
            return EXIT_FAILED
        for room in list(client.channels):
            await client.leave(room)
        for task in readers:
            task.cancel()
    state.show(f"chat: left; received {state.others} messages from others, {state.own} of our own echoed")
    return EXIT_OK


# -- the server ---------------------------------------------------------------------------


def default_files() -> Path:
    """Where uploads go without --files: ``$XDG_DATA_HOME/polymux/webchat-files``
    (``~/.local/share/polymux/webchat-files``), the same folder at every start."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "polymux" / "webchat-files"


def add_server_options(group: argparse._ActionsContainer, *, web_default: str | None = None) -> None:
    """The server's own options (--web, --files, --allow-host, --history, --max-upload,
    --queue, --policy); ``web_default``: --web's default (polymux webchat's page)."""
    where = f" (default {web_default})" if web_default else " too"
    group.add_argument(
        "--web",
        metavar="HOST:PORT",
        default=web_default,
        help=f"serve the web page and its WebSocket (omnistreams) there{where}",
    )
    group.add_argument(
        "--files",
        metavar="DIR",
        help=f"uploads from the page land here (default: {default_files()}, kept between starts)",
    )
    group.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="also answer web requests sent to this host name (repeatable; default: loopback names "
        "and the address listened on; '*': any, only behind a proxy that checks Host)",
    )
    group.add_argument(
        "--history",
        type=int,
        help="recent messages kept per room for pages that join (default 100)",
    )
    group.add_argument("--max-upload", type=size, metavar="SIZE", help="largest upload (e.g. 1GiB)")
    group.add_argument("--queue", type=int, help="messages queued per member (default 256)")
    group.add_argument(
        "--policy", choices=POLICIES, help="for a member whose queue is full (default disconnect)"
    )
    add_limit_options(group)  # --max-memory, --max-connections-per-address


def check_server_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *, given: Sequence[str] = (), mode: str = ""
) -> None:
    """Complete and check the server's arguments (``parser.error`` on bad ones); ``given``:
    options of the client that were given, refused in ``mode``."""
    if given:
        parser.error(f"{given[0]} is an option of the client: not with {mode}")
    _fill(args, {"allow_host": [], "history": 100, "queue": 256, "policy": "disconnect"})
    if not args.tcp and not args.unix and not args.web:
        parser.error("give --tcp HOST:PORT, --unix PATH and/or --web HOST:PORT")
    from polymux.web import static_files

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


def _client_command() -> str:
    """How to run ``polymux chat`` from here: the ``polymux`` command when that is what runs,
    else this Python with ``-m polymux``."""
    if os.path.basename(sys.argv[0]) == "polymux":
        return "polymux"
    python = os.path.relpath(sys.executable)
    python = sys.executable if python.startswith("..") else python
    return f"{python} -m polymux"


def _terminal_hint(protocol: str, where: Address) -> str:
    """How a terminal client joins the rooms the page shows."""
    return (
        f"chat: terminal clients join with: {_client_command()} chat "
        f"--protocol {protocol} --tcp {where.host}:{where.port} --nick NAME --room lobby"
    )


async def _serve_web(chat: ChatServer, address: Address, args: argparse.Namespace) -> polymux.Server:
    """The page and its channels on one port: HTTP GETs get the page's files, the
    WebSocket at /ws carries omnistreams."""
    from polymux.apps.webchat import WEB_PAGE, WebChat
    from polymux.web import static_files

    root = Path(args.files) if args.files else default_files()
    web = WebChat(chat, root, max_upload=args.max_upload)
    files: dict[str, Any] = {
        "/": WEB_PAGE / "index.html",
        "/stats.json": lambda: json.dumps(web.stats()).encode(),
    }
    for path in sorted(WEB_PAGE.iterdir()):
        if path.suffix in (".js", ".css"):
            files["/" + path.name] = path
    server = await polymux.serve_websocket(
        web.handle,
        address.host,
        address.port,
        protocol="omnistreams",
        process_request=static_files(files, allowed_hosts=_allowed_hosts(address, args.allow_host)),
        **session_options(args),
        **server_options(args),
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


def _allowed_hosts(address: Address, extra: list[str]) -> list[str]:
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


async def run_server(args: argparse.Namespace) -> int:
    """The chat server (and its web page with --web) until Ctrl-C or SIGTERM; the exit
    status."""
    chat = ChatServer(queue_size=args.queue, policy=args.policy, history=args.history)
    addresses = [parse_address(args.tcp, None)] if args.tcp else []
    if args.unix:
        addresses.append(parse_address(None, args.unix))
    servers: list[polymux.Server] = []
    try:
        for address in addresses:
            options = {**session_options(args), **conversation_options(args.protocol), **server_options(args)}
            server = await listen(address, chat.handle, args.protocol, **options)
            servers.append(server)
            print(f"chat: {args.protocol} on {listening_on(server, address)}", flush=True)
        if args.web:
            servers.append(await _serve_web(chat, parse_address(args.web, None), args))
            if args.tcp:
                where = listening_on(servers[0], parse_address(args.tcp, None))
                print(_terminal_hint(args.protocol, where), flush=True)
    except OSError as exc:
        print(f"chat: cannot listen: {exc}", file=sys.stderr)
        for server in servers:
            server.close()
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
