"""A chat client over polymux: one channel per room joined.

    python examples/chat/client.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --nick ada --room lobby

Interactive by default: each line of stdin is a message to the first room (a line
"#room text" goes to another joined room); end of input leaves. Scripted use (tests,
load): --say TEXT sends lines, --send N --size BYTES sends N generated messages,
--expect N waits for N messages from others, --until TEXT for someone to say TEXT, and
--pause-reading-after N stops reading after N messages until the process gets SIGUSR1
(a slow client).

When the connection is lost (closed, reset, or silent: nothing from the server for
--ping-interval seconds and no answer to a ping within --ping-timeout), the client
connects again by itself, waiting 0.5 s, 1 s, 2 s ... up to 15 s between attempts (each
wait drawn at random between half and all of that), at most --retries times in a row;
it joins its rooms again and shows what was said meanwhile, each message once and in
order, marked "(missed)", and says how many the server no longer held. What you said
while away is sent once the room is joined again, and never twice (polymux.apps.chatclient).

Exit status (the table of every polymux command): 0 after leaving normally; 1 when a join
is refused, the server disconnects us (e.g. the slow-client policy) or the retries are
spent; 2 for bad arguments; 3 when there is no session at the start (nothing listens
there, or the server speaks another wire format).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from polymux import PolymuxError
from polymux.apps.chatclient import ReconnectingChatClient
from polymux.apps.common import (
    EXIT_FAILED,
    EXIT_NO_SESSION,
    EXIT_OK,
    EXIT_STATUS,
    NoSession,
    add_address_options,
    add_session_options,
    connect,
    format_bytes,
    parse_address,
    peer_mismatch,
    run,
    seconds,
    seconds_or_off,
    session_options,
    size,
)
from polymux.apps.records import RecordError


class State:
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


def describe(record: dict[str, Any], room: str) -> str | None:
    """The line a record shows as, or None."""
    kind = record["type"]
    mark = " (missed)" if record.get("missed") else " (earlier)" if record.get("history") else ""
    if kind == "msg":
        return f"[#{room}] {record.get('nick')}: {record.get('text')}{mark}"
    if kind == "joined":
        return f"* {record.get('nick')} joined #{room}"
    if kind == "left":
        reason = record.get("reason")
        why = f" ({reason})" if reason and reason != "left" else ""
        return f"* {record.get('nick')} left #{room}{why}"
    if kind == "renamed":
        return f"* {record.get('old')} is now {record.get('nick')} in #{room}"
    if kind == "file":
        return (
            f"* {record.get('nick')} put {record.get('name')} ({format_bytes(record.get('size', 0))}) "
            f"on the server, in #{room}{mark}"
        )
    if kind == "dropped":
        return (
            f"* the server dropped {record.get('count')} messages and {record.get('notices')} "
            f"notices of #{room} for us (too slow)"
        )
    if kind == "error":
        return f"* error from the server: {record.get('message')}"
    if kind == "welcome":  # a room joined again after a reconnection
        return f"* back in #{room} as {record.get('nick')}; members: {', '.join(record.get('members', []))}"
    if kind == "catchup":
        missed, lost = record.get("missed", 0), record.get("lost")
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
    return None  # typing, duplicate: nothing to show in a terminal


async def consume(client: ReconnectingChatClient, state: State) -> None:
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
        if kind == "msg":
            if event.get("history"):
                if not args.quiet:
                    state.show(describe(event, room) or "")
                continue
            received += 1
            if event.get("nick") == client.nick:
                state.own += 1
            else:
                state.others += 1
                if args.expect is not None and state.others >= args.expect:
                    state.others_done.set()
                if args.until is not None and event.get("text") == args.until:
                    state.until.set()
            if not args.quiet:
                state.show(describe(event, room) or "")
        elif kind == "disconnected":
            state.show(f"* connection lost: {event['reason']}")
        elif kind == "reconnecting":
            state.show(
                f"* reconnecting (attempt {event['attempt']}/{event['attempts']}, next in {event['delay']:.1f} s)"
            )
        elif kind == "reconnected":
            state.show(f"* reconnected (attempt {event['attempt']})")
        elif kind == "gave up":
            state.ended = f"gave up reconnecting after {event['attempts']} attempts: {event['reason']}"
        elif kind == "closed":
            state.show(f"chat: disconnected from #{room}: {event['reason']}")
            state.ended = state.ended or f"disconnected from #{room}"
        elif (line := describe(event, room)) is not None:
            state.show(line)


async def interactive(client: ReconnectingChatClient, rooms: list[str], state: State) -> None:
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


async def send_all(client: ReconnectingChatClient, room: str, args: argparse.Namespace) -> None:
    for text in args.say:
        await client.say(room, text)
    for i in range(args.send or 0):
        prefix = f"{args.nick} message {i} "
        await client.say(room, prefix + "." * max(0, args.size - len(prefix)))
    await client.delivered()


async def main(args: argparse.Namespace) -> int:
    state = State(args)
    address = parse_address(args.tcp, args.unix)

    async def open_session() -> Any:
        # The first connection may take its time; later ones give up sooner (and retry).
        return await connect(
            address, args.protocol, timeout=30 if not client.connections else 10, **session_options(args)
        )

    client = ReconnectingChatClient(
        open_session,
        args.nick,
        retries=args.retries,
        ping_interval=args.ping_interval,
        ping_timeout=args.ping_timeout,
        history=args.history,
    )
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
    reader = asyncio.ensure_future(consume(client, state))
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
        send_all(client, first, args) if scripted else interactive(client, args.room, state)
    )
    done = asyncio.gather(work, *goals)
    finished, _pending = await asyncio.wait({done, reader}, return_when=asyncio.FIRST_COMPLETED)
    if done not in finished:
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_session_options(parser)
    add_address_options(parser)
    parser.add_argument("--nick", required=True)
    parser.add_argument("--room", action="append", help="room to join (repeatable; default lobby)")
    parser.add_argument("--say", action="append", default=[], metavar="TEXT", help="send TEXT (repeatable)")
    parser.add_argument(
        "--send", type=int, metavar="N", help="send N generated messages, wait for their echo"
    )
    parser.add_argument(
        "--size", type=size, default=64, metavar="SIZE", help="bytes per generated message (default 64)"
    )
    parser.add_argument("--expect", type=int, metavar="N", help="leave after N messages from others")
    parser.add_argument("--until", metavar="TEXT", help="leave once someone says TEXT")
    parser.add_argument("--pause-reading-after", type=int, metavar="N", help="stop reading after N messages")
    parser.add_argument("--quiet", action="store_true", help="do not print messages")
    parser.add_argument(
        "--history", type=int, default=0, metavar="N", help="show the last N messages of each room on joining"
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=10,
        metavar="N",
        help="attempts to reconnect after a lost connection before giving up (default 10; 0: exit at once)",
    )
    parser.add_argument(
        "--ping-interval",
        type=seconds_or_off,
        default=15.0,
        metavar="SECONDS",
        help="check the connection after this long without a word from the server (default 15; off)",
    )
    parser.add_argument(
        "--ping-timeout",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="seconds the server has to answer that check before the connection counts as lost (default 10)",
    )
    args = parser.parse_args()
    args.room = args.room or ["lobby"]
    if args.retries < 0:
        parser.error("--retries must be >= 0")
    if args.history < 0:
        parser.error("--history must be >= 0")
    try:
        parse_address(args.tcp, args.unix)
    except ValueError as exc:
        parser.error(str(exc))
    return args


if __name__ == "__main__":
    arguments = parse_args()
    try:
        sys.exit(run(main(arguments), use_uvloop=arguments.uvloop))
    except KeyboardInterrupt:
        sys.exit(130)  # Ctrl-C
