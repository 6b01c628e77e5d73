"""Chat over polymux: rooms are channels. A client opens one channel per room it joins;
the server relays every message of a room to all its members.

Records (:mod:`polymux.apps.records`, msgpack maps with a ``type``)::

    client -> server   join {room, nick}, say {text}, leave {}
    server -> client   welcome {room, nick, members}, msg {room, nick, text, seq, ts},
                       joined {room, nick}, left {room, nick, reason},
                       dropped {count, notices}, error {message}

A slow client never stalls a room. Each member has its own bounded queue (``queue_size``
records) and its own writer task, which waits on ``drain()`` (the channel's flow control)
for that member only; relaying a message only appends to the queues. When a member's
queue is full the server applies the policy:

* ``disconnect`` (default): the member is removed from the room, its channel is reset
  with the reason (MultiplexingStream v2/v3 carry the text; other formats reset without
  one) and the others get ``left {reason: "too slow ..."}``. The member keeps what it had
  already received, then gets the reset.
* ``drop``: the member stays, messages that do not fit are dropped for it alone, and it
  gets ``dropped {count, notices}`` (messages, and joined/left notices) where they would
  have been (after the messages that were queued), so it knows exactly what it missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field as dc_field
from typing import Any

from polymux.aio.session import Session
from polymux.apps.records import RecordError, field, read_record, write_record
from polymux.exceptions import PolymuxError


__all__ = ["POLICIES", "ChatClient", "ChatServer", "Member", "check_label"]

POLICIES = ("disconnect", "drop")
"""Slow-member policies of :class:`ChatServer`."""

MAX_TEXT = 16 * 1024
"""Longest message text (characters)."""

MAX_LABEL = 64
"""Longest room name or nick."""

CHANNEL_PREFIX = "chat/"


def check_label(what: str, value: object) -> str:
    """A room name or nick: 1 to 64 printable characters; raises ``ValueError``."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_LABEL:
        raise ValueError(f"{what} is longer than {MAX_LABEL} characters")
    if not value.isprintable():
        raise ValueError(f"{what} contains non-printable characters: {value!r}")
    return value


@dataclass(eq=False)
class Member:
    """One client in one room (one channel)."""

    nick: str
    room: str
    peer: str
    writer: asyncio.StreamWriter
    queue: asyncio.Queue[dict[str, Any]]
    task: asyncio.Task[None] | None = None
    dropped: int = 0
    """Messages dropped since the last ``dropped`` notice (``drop`` policy)."""
    dropped_notices: int = 0
    """Notices (joined, left) dropped since the last ``dropped`` notice."""
    gone: bool = False
    stats: dict[str, int] = dc_field(default_factory=lambda: {"sent": 0, "dropped": 0})


class ChatServer:
    """The chat server's channel handler: ``polymux.start_server(server.handle, ...)``.

    ``queue_size`` bounds each member's queue (records); ``policy`` is ``"disconnect"`` or
    ``"drop"`` (see the module docstring); ``log(line)`` gets one line per event.
    """

    def __init__(
        self, *, queue_size: int = 256, policy: str = "disconnect", log: Callable[[str], None] | None = None
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size!r}")
        self.queue_size = queue_size
        self.policy = policy
        self.log = log or (lambda line: print(line, flush=True))
        self.rooms: dict[str, dict[str, Member]] = {}
        """Room name -> nick -> member."""
        self._seq = itertools.count(1)
        self.evicted = 0
        """Members removed by the ``disconnect`` policy."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one channel: a join, then messages until the member leaves."""
        peer = _peer(writer)
        member: Member | None = None
        try:
            join = await read_record(reader)
            if join is None:
                return
            try:
                if join["type"] != "join":
                    raise ValueError(f"expected a join record, got {join['type']!r}")
                room = check_label("room", join.get("room"))
                nick = check_label("nick", join.get("nick"))
                if nick in self.rooms.get(room, {}):
                    raise ValueError(f"nick {nick!r} is taken in room {room!r}")
            except ValueError as exc:
                self.log(f"refused: join from {peer}: {exc}")
                write_record(writer, {"type": "error", "message": str(exc)})
                await writer.drain()
                return
            member = self._join(room, nick, peer, writer)
            while (record := await read_record(reader)) is not None:
                if record["type"] == "say":
                    text = field(record, "text", str)[:MAX_TEXT]
                    self._broadcast(
                        room,
                        {
                            "type": "msg",
                            "room": room,
                            "nick": nick,
                            "text": text,
                            "seq": next(self._seq),
                            "ts": time.time(),
                        },
                    )
                    # Let the members' writers run before the next record: a burst read at
                    # once must not fill the queues of members that keep up.
                    await asyncio.sleep(0)
                elif record["type"] == "leave":
                    break
                else:
                    raise RecordError(f"unknown record type {record['type']!r}")
        except (RecordError, ConnectionError, PolymuxError) as exc:
            if member is None or not member.gone:
                self.log(f"error: channel from {peer}: {exc}")
        finally:
            if member is not None:
                self._leave(member, "left")
            with contextlib.suppress(Exception):
                writer.close()

    def _join(self, room: str, nick: str, peer: str, writer: asyncio.StreamWriter) -> Member:
        members = self.rooms.setdefault(room, {})
        member = Member(nick, room, peer, writer, asyncio.Queue(self.queue_size))
        member.task = asyncio.get_running_loop().create_task(self._pump(member))
        members[nick] = member
        self._enqueue(member, {"type": "welcome", "room": room, "nick": nick, "members": sorted(members)})
        self._broadcast(room, {"type": "joined", "room": room, "nick": nick}, exclude=member)
        self.log(f"join: {nick} in #{room} from {peer} ({len(members)} members)")
        return member

    def _leave(self, member: Member, reason: str) -> None:
        if member.gone:
            return
        member.gone = True
        members = self.rooms.get(member.room, {})
        if members.get(member.nick) is member:
            del members[member.nick]
        if not members:
            self.rooms.pop(member.room, None)
        if member.task is not None:
            member.task.cancel()
        self._broadcast(
            member.room, {"type": "left", "room": member.room, "nick": member.nick, "reason": reason}
        )
        self.log(f"leave: {member.nick} from #{member.room} ({reason})")

    def _broadcast(self, room: str, record: dict[str, Any], exclude: Member | None = None) -> None:
        for member in list(self.rooms.get(room, {}).values()):
            if member is not exclude:
                self._enqueue(member, record)

    def _enqueue(self, member: Member, record: dict[str, Any]) -> None:
        if member.gone:
            return
        try:
            member.queue.put_nowait(record)
        except asyncio.QueueFull:
            if self.policy == "drop":
                if record["type"] == "msg":
                    member.dropped += 1
                else:
                    member.dropped_notices += 1
                member.stats["dropped"] += 1
                if member.stats["dropped"] == 1:
                    self.log(
                        f"slow: {member.nick} in #{member.room} is behind; dropping messages for it (policy: drop)"
                    )
                return
            reason = f"too slow: {self.queue_size} messages queued (policy: disconnect)"
            self.evicted += 1
            self.log(f"slow: disconnecting {member.nick} from #{member.room}: {reason}")
            self._leave(member, reason)
            transport: Any = member.writer.transport
            reset = getattr(transport, "reset", None)
            if reset is not None:
                reset(reason)
            else:
                transport.abort()

    async def _pump(self, member: Member) -> None:
        """Write the member's queue to its channel; waits on its flow control only."""
        writer, queue = member.writer, member.queue
        try:
            while True:
                if (member.dropped or member.dropped_notices) and queue.empty():
                    # What was dropped came after everything queued: say so right after it.
                    write_record(
                        writer,
                        {"type": "dropped", "count": member.dropped, "notices": member.dropped_notices},
                    )
                    member.dropped = member.dropped_notices = 0
                    await writer.drain()
                    continue
                record = await queue.get()
                while True:
                    write_record(writer, record)
                    member.stats["sent"] += 1
                    if queue.empty():
                        break
                    record = queue.get_nowait()
                await writer.drain()
        except (ConnectionError, PolymuxError):
            pass


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return str(peer) if peer else "unix socket"


class ChatClient:
    """A chat client on one session: :meth:`join` rooms, :meth:`say`, and read with
    :meth:`listen`. ``on_record(room, record)`` sees every record the server sends."""

    def __init__(self, session: Session, nick: str) -> None:
        self.session = session
        self.nick = check_label("nick", nick)
        self.channels: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def join(self, room: str) -> dict[str, Any]:
        """Join ``room`` (a new channel); return the welcome record. Raises
        ``ValueError`` with the server's message if it refuses."""
        check_label("room", room)
        # A pair of streams on one-way formats (omnistreams): a room talks both ways.
        async with asyncio.timeout(self.session.config.handshake_timeout):
            reader, writer = await self.session.open_pair(CHANNEL_PREFIX + room)
        write_record(writer, {"type": "join", "room": room, "nick": self.nick})
        await writer.drain()
        welcome = await read_record(reader)
        if welcome is None or welcome["type"] == "error":
            writer.close()
            message = welcome.get("message") if welcome else "the server closed the channel"
            raise ValueError(f"cannot join #{room}: {message}")
        if welcome["type"] != "welcome":
            writer.close()
            raise RecordError(f"expected welcome, got {welcome['type']!r}")
        self.channels[room] = (reader, writer)
        return welcome

    async def say(self, room: str, text: str) -> None:
        """Send a message to ``room`` (waits on the channel's flow control)."""
        _reader, writer = self.channels[room]
        write_record(writer, {"type": "say", "text": text})
        await writer.drain()

    async def leave(self, room: str) -> None:
        """Leave ``room`` and close its channel."""
        _reader, writer = self.channels.pop(room)
        with contextlib.suppress(ConnectionError, PolymuxError):
            write_record(writer, {"type": "leave"})
            writer.write_eof()
            await writer.drain()
        writer.close()

    async def read(self, room: str) -> dict[str, Any] | None:
        """The next record of ``room`` (None when the server closed the channel)."""
        reader, _writer = self.channels[room]
        return await read_record(reader)
