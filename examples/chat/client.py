"""A chat client over polymux: one channel per room joined.

    python examples/chat/client.py --protocol mstream-v3 --tcp 127.0.0.1:9000 --nick ada --room lobby

Interactive by default: each line of stdin is a message to the first room (a line
"#room text" goes to another joined room); end of input leaves. Scripted use (tests,
load): --say TEXT sends lines, --send N --size BYTES sends N generated messages,
--expect N waits for N messages from others, --until TEXT for someone to say TEXT, and
--pause-reading-after N stops reading after N messages until the process gets SIGUSR1
(a slow client).

Exit status (the table of every polymux command): 0 after leaving normally; 1 when a join
is refused or the server disconnects us (e.g. the slow-client policy); 2 for bad
arguments; 3 when there is no session (nothing listens there, or the server speaks
another wire format).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from polymux import PolymuxError
from polymux.apps.chat import ChatClient
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
    session_options,
    size,
)
from polymux.apps.records import RecordError


class State:
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


async def read_room(client: ChatClient, room: str, state: State) -> None:
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


async def interactive(client: ChatClient, rooms: list[str], state: State) -> None:
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


async def main(args: argparse.Namespace) -> int:
    state = State(args)
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
            readers.append(asyncio.create_task(read_room(client, room, state)))
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
            send_all(client, first, args) if goals else interactive(client, args.room, state)
        )
        done = asyncio.gather(work, *goals)
        finished, _pending = await asyncio.wait(
            {done, state.disconnected}, return_when=asyncio.FIRST_COMPLETED
        )
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


async def send_all(client: ChatClient, room: str, args: argparse.Namespace) -> None:
    for text in args.say:
        await client.say(room, text)
    for i in range(args.send or 0):
        prefix = f"{args.nick} message {i} "
        await client.say(room, prefix + "." * max(0, args.size - len(prefix)))


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
    args = parser.parse_args()
    args.room = args.room or ["lobby"]
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
