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
webchat takes terminal clients) or --unix PATH, in --protocol (default mstream-v3);
--history N shows each room's last N messages on joining.

When the connection is lost (closed, reset, or silent: nothing from the server for
--ping-interval seconds and no answer to a ping within --ping-timeout), the client
connects again by itself, waiting 0.5 s, 1 s, 2 s ... up to 15 s between attempts (each
wait drawn at random between half and all of that), at most --retries times in a row;
it joins its rooms again and shows what was said meanwhile, each message once and in
order, marked "(missed)", and says how many the server no longer held. What you said
while away is sent once the room is joined again, and never twice
(polymux.apps.chatclient.ReconnectingChatClient).

The server (--server) listens on --tcp and/or --unix, any wire format with two-way
channels; --web HOST:PORT also serves the web page (what polymux webchat starts). Each room
numbers its messages and keeps its last --history of them (default 100): a client that
comes back after a lost connection gets what it missed, once and in order, and is told how
many the room no longer held (polymux.apps.chat). A slow client never stalls a room: each
member has a bounded queue (--queue messages) and its own writer; when the queue is full
the --policy applies: disconnect (default; the member's channel is reset with the reason
and the room is told) or drop (that member misses messages and is told how many). One line
is logged per join, leave and slow member. Ctrl-C or SIGTERM stops it (exit 0); a server
that cannot listen exits 1.

Exit status of the client: 0 after leaving normally; 1 when a join is refused, the server
disconnects us (e.g. the slow-client policy) or the retries are spent; 2 for bad arguments;
3 when there is no session at the start (nothing listens there, or the server speaks
another wire format).
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
from polymux.apps.chat import POLICIES, ChatServer
from polymux.apps.chatclient import ReconnectingChatClient
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
    seconds,
    seconds_or_off,
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
    "client_options",
    "default_files",
    "describe",
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

CLIENT_OPTIONS = (
    "nick",
    "room",
    "say",
    "send",
    "size",
    "expect",
    "until",
    "pause_reading_after",
    "quiet",
    "retries",
    "ping_interval",
    "ping_timeout",
)
"""The options of the client alone (refused with --server)."""

SERVER_OPTIONS = (
    "web",
    "files",
    "allow_host",
    "max_upload",
    "queue",
    "policy",
    "max_memory",
    "max_connections_per_address",
)
"""The options of the server alone (refused without --server). --history belongs to both,
with a meaning in each."""


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
    parser.add_argument(
        "--history",
        type=int,
        metavar="N",
        help="client: show the last N messages of each room on joining (default 0); server: "
        "recent messages kept per room, for pages that join and clients that come back (default 100)",
    )
    add_client_options(parser.add_argument_group("client"))
    add_server_options(parser.add_argument_group("server (with --server)"), history=False)
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
    """The client's own options (--nick, --room, the scripted-use options, reconnection)."""
    group.add_argument("--nick", help="your nick (required for the client)")
    group.add_argument("--room", action="append", help="room to join (repeatable; default lobby)")
    group.add_argument("--say", action="append", metavar="TEXT", help="send TEXT (repeatable)")
    group.add_argument("--send", type=int, metavar="N", help="send N generated messages, wait for their echo")
    group.add_argument("--size", type=size, metavar="SIZE", help="bytes per generated message (default 64)")
    group.add_argument("--expect", type=int, metavar="N", help="leave after N messages from others")
    group.add_argument("--until", metavar="TEXT", help="leave once someone says TEXT")
    group.add_argument("--pause-reading-after", type=int, metavar="N", help="stop reading after N messages")
    group.add_argument("--quiet", action="store_true", default=None, help="do not print messages")
    group.add_argument(
        "--retries",
        type=int,
        metavar="N",
        help="attempts to reconnect after a lost connection before giving up (default 10; 0: exit at once)",
    )
    group.add_argument(
        "--ping-interval",
        type=_ping_interval,
        metavar="SECONDS",
        help="check the connection after this long without a word from the server (default 15; off)",
    )
    group.add_argument(
        "--ping-timeout",
        type=seconds,
        metavar="SECONDS",
        help="seconds the server has to answer that check before the connection counts as lost (default 10)",
    )


_PING_OFF = 0.0
"""--ping-interval off, as parsed: not None, which means "not given" (then the default holds)."""


def _ping_interval(text: str) -> float:
    value = seconds_or_off(text)
    return _PING_OFF if value is None else value


def check_client_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Complete and check the client's arguments (``parser.error`` on bad ones)."""
    if not args.nick:
        parser.error("the client needs --nick NAME")
    _fill(
        args,
        {
            "room": ["lobby"],
            "say": [],
            "size": 64,
            "quiet": False,
            "history": 0,
            "retries": 10,
            "ping_interval": 15.0,
            "ping_timeout": 10.0,
        },
    )
    if args.retries < 0:
        parser.error("--retries must be >= 0")
    if args.history < 0:
        parser.error("--history must be >= 0")
    if args.tcp is not None and args.unix is not None:
        parser.error("give --tcp HOST:PORT or --unix PATH, not both")
    if args.tcp is None and args.unix is None:
        args.tcp = DEFAULT_TCP
    try:
        parse_address(args.tcp, args.unix)
    except ValueError as exc:
        parser.error(str(exc))


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~polymux.apps.chatclient.ReconnectingChatClient` keywords of the client's
    arguments (checked by :func:`check_client_args`)."""
    return {
        "retries": args.retries,
        "ping_interval": None if args.ping_interval == _PING_OFF else args.ping_interval,
        "ping_timeout": args.ping_timeout,
        "history": args.history,
    }


class _State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.own = 0
        self.others = 0
        self.others_done = asyncio.Event()
        self.resume = asyncio.Event()
        self.until = asyncio.Event()
        self.ended = ""
        """Why the client stopped by itself (every room closed, retries spent)."""

    def show(self, line: str) -> None:
        print(line, flush=True)


def describe(event: dict[str, Any], room: str) -> str | None:
    """The line a terminal shows for a record of ``room`` (an event of
    :class:`~polymux.apps.chatclient.ReconnectingChatClient`), or None for one it does not
    show (typing, duplicate). Messages caught up after a lost connection are marked
    "(missed)", those of the history asked for on joining "(earlier)"."""
    kind = event["type"]
    mark = " (missed)" if event.get("missed") else " (earlier)" if event.get("history") else ""
    if kind == "msg":
        return f"[#{room}] {event.get('nick')}: {event.get('text')}{mark}"
    if kind == "joined":
        return f"* {event.get('nick')} joined #{room}"
    if kind == "left":
        reason = event.get("reason")
        why = f" ({reason})" if reason and reason != "left" else ""
        return f"* {event.get('nick')} left #{room}{why}"
    if kind == "renamed":
        return f"* {event.get('old')} is now {event.get('nick')} in #{room}"
    if kind == "file":
        return (
            f"* {event.get('nick')} put {event.get('name')} ({format_bytes(event.get('size', 0))}) "
            f"on the server, in #{room}{mark}"
        )
    if kind == "dropped":
        return (
            f"* the server dropped {event.get('count')} messages and {event.get('notices')} "
            f"notices of #{room} for us (too slow)"
        )
    if kind == "error":
        return f"* error from the server: {event.get('message')}"
    if kind == "welcome":  # a room joined again after a reconnection
        return f"* back in #{room} as {event.get('nick')}; members: {', '.join(event.get('members', []))}"
    if kind == "catchup":
        missed, lost = event.get("missed", 0), event.get("lost")
        lines = []
        if lost is None:
            lines.append(
                f"* the server restarted (or forgot #{room}): what was said there meanwhile may be lost"
            )
        elif lost:
            lines.append(
                f"* {lost} messages said in #{room} while you were away are lost (the server no longer holds them)"
            )
        if missed:
            lines.append(f"* {missed} messages said in #{room} while you were away:")
        return "\n".join(lines) or f"* nothing was said in #{room} while you were away"
    if kind == "disconnected":
        return f"* connection lost: {event['reason']}"
    if kind == "reconnecting":
        return (
            f"* reconnecting (attempt {event['attempt']}/{event['attempts']}, next in {event['delay']:.1f} s)"
        )
    if kind == "reconnected":
        return f"* reconnected (attempt {event['attempt']})"
    return None  # typing, duplicate: nothing to show in a terminal


async def _consume(client: ReconnectingChatClient, state: _State) -> None:
    """Show what comes, count it, until the client is done."""
    args = state.args
    received = 0
    paused = False
    while True:
        if args.pause_reading_after is not None and received == args.pause_reading_after and not paused:
            paused = True
            rooms = ", ".join(f"#{room}" for room in args.room)
            state.show(f"paused reading {rooms} after {received} messages (SIGUSR1 resumes)")
            await state.resume.wait()
            state.show(f"resumed reading {rooms}")
        event = await client.next_event()
        if event is None:
            return
        kind = event["type"]
        room = str(event.get("room", ""))
        if kind == "msg" and not event.get("history"):  # history asked for on joining: shown only
            received += 1
            if event.get("nick") == client.nick:
                state.own += 1
            else:
                state.others += 1
                if args.expect is not None and state.others >= args.expect:
                    state.others_done.set()
                if args.until is not None and event.get("text") == args.until:
                    state.until.set()
        if kind == "msg":
            if not args.quiet:
                state.show(describe(event, room) or "")
        elif kind == "gave up":
            state.ended = f"gave up reconnecting after {event['attempts']} attempts: {event['reason']}"
        elif kind == "closed":
            state.show(f"chat: disconnected from #{room}: {event['reason']}")
            state.ended = state.ended or f"disconnected from #{room}"
        elif (line := describe(event, room)) is not None:
            state.show(line)


async def _interactive(client: ReconnectingChatClient, rooms: list[str], state: _State) -> None:
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        text = line.rstrip("\n")
        room = rooms[0]
        if text.startswith("#") and " " in text and text[1:].split(" ", 1)[0] in rooms:
            room, text = text[1:].split(" ", 1)
        if room not in client.rooms:
            state.show(f"* not sent: #{room} is closed")
        elif text.strip():  # the server refuses blank messages
            if client.session is None:
                state.show("* not connected: sent once the connection is back")
            await client.say(room, text)
    # End of input: leave once what we said reached the room.
    await client.delivered()


async def _send_all(client: ReconnectingChatClient, room: str, args: argparse.Namespace) -> None:
    for text in args.say:
        await client.say(room, text)
    for i in range(args.send or 0):
        prefix = f"{args.nick} message {i} "
        await client.say(room, prefix + "." * max(0, args.size - len(prefix)))
    await client.delivered()


async def run_client(args: argparse.Namespace) -> int:
    """The client: join ``args.room`` as ``args.nick``, then talk (interactive or scripted),
    coming back after a lost connection (:class:`~polymux.apps.chatclient.ReconnectingChatClient`);
    the exit status."""
    state = _State(args)
    address = parse_address(args.tcp, args.unix)

    async def open_session() -> polymux.Session:
        # The first connection may take its time; later ones give up sooner (and retry).
        return await connect(
            address, args.protocol, timeout=30 if not client.connections else 10, **session_options(args)
        )

    client = ReconnectingChatClient(open_session, args.nick, **client_options(args))
    try:
        welcomes = await client.start(args.room)
    except NoSession as exc:
        print(f"chat: {exc}", file=sys.stderr)
        return EXIT_NO_SESSION
    except (ConnectionError, PolymuxError, RecordError, ValueError) as exc:
        session = client.session
        why = peer_mismatch(session) if session is not None else None
        await client.close()
        if why is not None:
            print(f"chat: no {args.protocol} session with {address}: {why}", file=sys.stderr)
            return EXIT_NO_SESSION
        if isinstance(exc, ValueError) and not isinstance(exc, RecordError):  # refused (a nick in use ...)
            print(f"chat: {exc}", file=sys.stderr)
        else:
            print(f"chat: cannot join: {exc}", file=sys.stderr)
        return EXIT_FAILED
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, state.resume.set)
    for room, welcome in zip(client.rooms, welcomes, strict=True):
        state.show(f"joined #{room} as {args.nick}; members: {', '.join(welcome.get('members', []))}")
    reader = asyncio.ensure_future(_consume(client, state))
    goals: list[Any] = []
    if args.send is not None or args.say:
        args.send = args.send or 0
    if args.expect is not None:
        goals.append(state.others_done.wait())
    if args.until is not None:
        goals.append(state.until.wait())
    first = args.room[0]
    scripted = bool(goals) or args.send is not None
    work = asyncio.ensure_future(
        _send_all(client, first, args) if scripted else _interactive(client, args.room, state)
    )
    done = asyncio.gather(work, *goals)
    waits: set[asyncio.Future[Any]] = {done, reader}
    finished, _pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    if done not in finished:  # the client stopped by itself (retries spent, every room closed)
        done.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await done
        await client.close()
        state.show(f"chat: {state.ended or 'disconnected'}")
        return EXIT_FAILED
    done.result()
    if client.closed:  # a room closed meanwhile: what was said there may not have reached it
        await client.close()
        state.show(f"chat: {state.ended or 'disconnected'}")
        return EXIT_FAILED
    await client.close()
    # What came before we left is shown (the reader ends once it has taken it all).
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            await asyncio.shield(reader)
    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    back = ""
    if client.outages:
        back = f"; came back after {client.outages} lost connection{'s' if client.outages > 1 else ''}"
    state.show(
        f"chat: left; received {state.others} messages from others, {state.own} of our own echoed{back}"
    )
    return EXIT_OK


# -- the server ---------------------------------------------------------------------------


def default_files() -> Path:
    """Where uploads go without --files: ``$XDG_DATA_HOME/polymux/webchat-files``
    (``~/.local/share/polymux/webchat-files``), the same folder at every start."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "polymux" / "webchat-files"


def add_server_options(
    group: argparse._ActionsContainer, *, web_default: str | None = None, history: bool = True
) -> None:
    """The server's own options (--web, --files, --allow-host, --history, --max-upload,
    --queue, --policy); ``web_default``: --web's default (polymux webchat's page);
    ``history=False`` leaves --history out (polymux chat has one for both of its modes)."""
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
    if history:
        group.add_argument(
            "--history",
            type=int,
            metavar="N",
            help="recent messages kept per room, for pages that join and clients that come back "
            "(default 100)",
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
