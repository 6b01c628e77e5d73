"""Chat over polymux: rooms are channels. A client opens one channel per room it joins;
the server relays every message of a room to all its members.

Records (:mod:`polymux.apps.records`, msgpack maps with a ``type``)::

    client -> server   join {room, nick, history?}, say {text}, nick {nick}, leave {}
    server -> client   welcome {room, nick, members}, msg {room, nick, text, seq, ts},
                       joined {room, nick}, left {room, nick, reason},
                       renamed {room, old, nick}, file {room, nick, name, size, seq, ts},
                       dropped {count, notices}, error {message, refused?}

``join {history: N}`` asks for the room's last N messages (and ``file`` notices), sent
right after the welcome with ``history: true``; clients that do not ask get none. Rooms
keep their recent messages while empty (``history`` per room, ``history_bytes`` in all),
so a page reloaded, or a client that reconnects, sees what was said. ``nick {nick}``
renames a member (the room gets ``renamed``); a ``say`` that is blank or longer than
``MAX_TEXT`` characters, and a nick that is taken or not a valid label, are refused with
``error {message, refused: "say" | "nick"}`` and the channel stays open; a record the
server cannot use closes the channel after ``error {message, closing: true}``. ``left`` says
why: ``left`` (a leave, or the client closed the channel or its connection),
``connection lost`` (cut), or the slow-member policy's reason.

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
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field as dc_field
from typing import Any

from polymux.aio.session import Session
from polymux.apps.records import RecordError, field, read_record, write_record
from polymux.exceptions import PolymuxError, ProtocolError, SessionClosed


__all__ = [
    "MAX_LABEL",
    "MAX_TEXT",
    "POLICIES",
    "ChatClient",
    "ChatServer",
    "History",
    "Member",
    "check_label",
]

POLICIES = ("disconnect", "drop")
"""Slow-member policies of :class:`ChatServer`."""

MAX_TEXT = 16 * 1024
"""Longest message text (characters)."""

MAX_LABEL = 64
"""Longest room name or nick."""

CHANNEL_PREFIX = "chat/"


def check_label(what: str, value: object) -> str:
    """A room name or nick: 1 to 64 printable characters, not blank, with no space at
    either end; raises ``ValueError`` saying what is wrong."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_LABEL:
        raise ValueError(f"{what} is longer than {MAX_LABEL} characters")
    if not value.isprintable():
        raise ValueError(f"{what} contains non-printable characters: {value!r}")
    if not value.strip():
        raise ValueError(f"{what} must not be blank")
    if value != value.strip():
        raise ValueError(f"{what} must not start or end with a space: {value!r}")
    return value


class History:
    """The recent ``msg`` and ``file`` records of each room, bounded: at most ``per_room``
    records per room and ``max_bytes`` over all rooms, counting each record's strings in
    UTF-8 and 64 bytes more (the rooms whose last record is oldest lose their oldest
    records first)."""

    def __init__(self, per_room: int = 100, max_bytes: int = 4 << 20) -> None:
        if per_room < 0 or max_bytes < 0:
            raise ValueError(f"history bounds must be >= 0, got {per_room!r}, {max_bytes!r}")
        self.per_room = per_room
        self.max_bytes = max_bytes
        self.bytes = 0
        """What the kept records weigh (their strings in UTF-8, plus 64 bytes each)."""
        self._rooms: OrderedDict[str, deque[dict[str, Any]]] = OrderedDict()

    @staticmethod
    def _weight(record: dict[str, Any]) -> int:
        return 64 + sum(
            len(v.encode("utf-8", "surrogatepass")) for v in record.values() if isinstance(v, str)
        )

    def add(self, room: str, record: dict[str, Any]) -> None:
        """Keep ``record`` as the newest of ``room``."""
        weight = self._weight(record)
        if not self.per_room or weight > self.max_bytes:
            return
        kept = self._rooms.pop(room, None) or deque()
        self._rooms[room] = kept  # the most recently active room goes last
        kept.append(record)
        self.bytes += weight
        if len(kept) > self.per_room:
            self.bytes -= self._weight(kept.popleft())
        while self.bytes > self.max_bytes:
            oldest_room, oldest = next(iter(self._rooms.items()))
            self.bytes -= self._weight(oldest.popleft())
            if not oldest:
                del self._rooms[oldest_room]

    def recent(self, room: str, n: int) -> list[dict[str, Any]]:
        """The last ``n`` records of ``room``, oldest first."""
        kept = self._rooms.get(room)
        if not kept or n <= 0:
            return []
        return list(kept)[-n:]


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
    backlog: list[dict[str, Any]] = dc_field(default_factory=list)
    """Written before the queue: the welcome and the history the member asked for (not
    counted against the queue's bound)."""


class ChatServer:
    """The chat server's channel handler: ``polymux.start_server(server.handle, ...)``.

    ``queue_size`` bounds each member's queue (records); ``policy`` is ``"disconnect"`` or
    ``"drop"`` (see the module docstring); ``log(line)`` gets one line per event;
    ``history`` records kept per room for ``join {history: N}``, in at most
    ``history_bytes`` over all rooms.
    """

    def __init__(
        self,
        *,
        queue_size: int = 256,
        policy: str = "disconnect",
        log: Callable[[str], None] | None = None,
        history: int = 100,
        history_bytes: int = 4 << 20,
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
        self.history = History(history, history_bytes)
        """The recent messages of each room."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one channel: a join, then messages until the member leaves."""
        peer = _peer(writer)
        member: Member | None = None
        reason = "left"
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
                wanted = join.get("history", 0)
                if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 0:
                    raise ValueError(f"history must be a count of messages, got {wanted!r}")
            except ValueError as exc:
                self.log(f"refused: join from {peer}: {exc}")
                write_record(writer, {"type": "error", "message": str(exc), "refused": "join"})
                await writer.drain()
                return
            member = self._join(room, nick, peer, writer, wanted)
            while (record := await read_record(reader)) is not None:
                kind = record["type"]
                if kind == "say":
                    self._say(member, field(record, "text", str))
                    # Let the members' writers run before the next record: a burst read at
                    # once must not fill the queues of members that keep up.
                    await asyncio.sleep(0)
                elif kind == "nick":
                    self._rename(member, record.get("nick"))
                elif kind == "leave":
                    break
                else:
                    raise RecordError(f"unknown record type {kind!r}")
        except SessionClosed as exc:
            # The client closed its connection (a page's tab closed: a clean WebSocket
            # close) is a leave; a cut is a lost connection; a broken format is an error.
            if isinstance(exc.__cause__, ProtocolError):
                reason = "disconnected: protocol error"
                self.log(f"error: channel from {peer}: {exc}")
            elif exc.__cause__ is not None:
                reason = "connection lost"
        except (ConnectionError, PolymuxError) as exc:
            reason = "connection lost"
            if member is None:
                self.log(f"lost: channel from {peer} before its join: {exc}")
        except RecordError as exc:
            reason = "disconnected: bad record"
            if member is None or not member.gone:
                self.log(f"error: channel from {peer}: {exc}")
                with contextlib.suppress(Exception):  # say why before closing the channel
                    message = f"the server closed the room after a record it cannot use ({exc})"
                    write_record(writer, {"type": "error", "message": message, "closing": True})
        finally:
            if member is not None:
                self._leave(member, reason)
            with contextlib.suppress(Exception):
                writer.close()

    def _say(self, member: Member, text: str) -> None:
        if not text.strip():
            self._refuse(member, "say", "an empty message was not sent")
            return
        if len(text) > MAX_TEXT:
            self._refuse(
                member, "say", f"a message of {len(text):,} characters was not sent (at most {MAX_TEXT:,})"
            )
            return
        record = {
            "type": "msg",
            "room": member.room,
            "nick": member.nick,
            "text": text,
            "seq": next(self._seq),
            "ts": time.time(),
        }
        self.history.add(member.room, record)
        self._broadcast(member.room, record)

    def _rename(self, member: Member, nick: object) -> None:
        members = self.rooms.get(member.room, {})
        try:
            new = check_label("nick", nick)
            if new in members and members[new] is not member:
                raise ValueError(f"nick {new!r} is taken in room {member.room!r}")
        except ValueError as exc:
            self._refuse(member, "nick", str(exc))
            return
        old = member.nick
        if new == old:
            return
        del members[old]
        members[new] = member
        member.nick = new
        self._broadcast(member.room, {"type": "renamed", "room": member.room, "old": old, "nick": new})
        self.log(f"nick: {old} is now {new} in #{member.room}")

    def _refuse(self, member: Member, what: str, message: str) -> None:
        self._enqueue(member, {"type": "error", "message": message, "refused": what})

    def post_file(self, room: str, nick: str, name: str, size: int) -> bool:
        """Tell ``room`` that ``nick`` put the file ``name`` (``size`` bytes) on the server:
        a ``file`` record to every member, kept in the history. False if ``nick`` is not
        in ``room`` (nothing is sent)."""
        if nick not in self.rooms.get(room, {}):
            return False
        record = {
            "type": "file",
            "room": room,
            "nick": nick,
            "name": name,
            "size": size,
            "seq": next(self._seq),
            "ts": time.time(),
        }
        self.history.add(room, record)
        self._broadcast(room, record)
        return True

    def _join(
        self, room: str, nick: str, peer: str, writer: asyncio.StreamWriter, history: int = 0
    ) -> Member:
        members = self.rooms.setdefault(room, {})
        member = Member(nick, room, peer, writer, asyncio.Queue(self.queue_size))
        members[nick] = member
        member.backlog.append({"type": "welcome", "room": room, "nick": nick, "members": sorted(members)})
        member.backlog.extend({**record, "history": True} for record in self.history.recent(room, history))
        member.task = asyncio.get_running_loop().create_task(self._pump(member))
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
            backlog, member.backlog = member.backlog, []
            for record in backlog:
                write_record(writer, record)
                member.stats["sent"] += 1
                await writer.drain()
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
    """A chat client on one session (any format, omnistreams over WebSocket included: each
    room is a channel pair): :meth:`join` rooms, :meth:`say`, and :meth:`read` what the
    server sends."""

    def __init__(self, session: Session, nick: str) -> None:
        self.session = session
        self.nick = check_label("nick", nick)
        self.channels: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def join(self, room: str, *, history: int = 0) -> dict[str, Any]:
        """Join ``room`` (a new channel); return the welcome record. Raises
        ``ValueError`` with the server's message if it refuses. ``history``: how many of
        the room's recent messages to get (as ``msg`` records with ``history: true``,
        read with :meth:`read` after the welcome)."""
        check_label("room", room)
        # A pair of streams on one-way formats (omnistreams): a room talks both ways.
        async with asyncio.timeout(self.session.config.handshake_timeout):
            reader, writer = await self.session.open_pair(CHANNEL_PREFIX + room)
        join: dict[str, Any] = {"type": "join", "room": room, "nick": self.nick}
        if history:
            join["history"] = history
        write_record(writer, join)
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

    async def rename(self, room: str, nick: str) -> None:
        """Ask to be called ``nick`` in ``room``: the server answers with ``renamed``
        (to everyone) or ``error {refused: "nick"}`` (to us), read with :meth:`read`."""
        _reader, writer = self.channels[room]
        write_record(writer, {"type": "nick", "nick": nick})
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
