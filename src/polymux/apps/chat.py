"""Chat over polymux: rooms are channels. A client opens one channel per room it joins;
the server relays every message of a room to all its members.

Records (:mod:`polymux.apps.records`, msgpack maps with a ``type``)::

    client -> server   join {room, nick, history?, since?, epoch?, token?},
                       say {text, id?}, nick {nick}, typing {}, ping {}, leave {}
    server -> client   welcome {room, nick, members, seq, epoch},
                       msg {room, nick, text, seq, ts, id?}, joined {room, nick},
                       left {room, nick, reason}, renamed {room, old, nick},
                       file {room, nick, name, size, seq, ts}, typing {room, nick},
                       catchup {room, missed, lost}, duplicate {room, id, seq}, pong {},
                       dropped {count, notices}, error {message, refused?, closing?, replaced?}

**Numbers.** Each room numbers its ``msg`` and ``file`` records 1, 2, 3 ... (``seq``), in
the order the room got them; ``epoch`` (in the welcome) names the numbering: it changes
when the server restarts, or when it forgot the room (``max_rooms`` rooms were active
since). The welcome's ``seq`` is the room's last number when the member joined.

**History.** ``join {history: N}`` asks for the room's last N messages (and ``file``
notices), sent right after the welcome with ``history: true``; clients that do not ask get
none. Rooms keep their recent messages while empty (``history`` per room,
``history_bytes`` in all), so a page reloaded sees what was said.

**Catching up.** A client that lost its connection joins again with ``since: S, epoch: E``,
the last number it got and the welcome's epoch: after the welcome comes ``catchup {missed,
lost}``, then the ``missed`` messages after S that the server still holds, in order, each
with ``missed: true``. ``lost`` counts those after S it no longer holds (``null`` when the
epoch changed: the server restarted, and cannot say how many there were). Every message
thus reaches a member once: live, or in its catch-up, or counted as lost.

**Exactly once.** ``say {id}``: an id the client chose (1 to 64 characters, unique per
client: 16 random hex digits). A ``say`` whose id the room already has (a client that
sent it just before its connection went, and sends it again after) is not relayed again:
the sender gets ``duplicate {id, seq}`` (the number it has). The room's ``msg`` carries
the id. The server remembers the last ``max_ids`` ids.

**Coming back before the server noticed.** A join may carry ``token``, a secret the
client chose (16 to 128 characters). A later join with the same nick and token replaces
that member at once (a client back after a cut the server has not noticed yet); the old
channel gets ``error {closing: true, replaced: true}`` and is closed, and the room is told
nothing (the member never left).

``nick {nick}`` renames a member (the room gets ``renamed``); ``typing {}`` tells the
others ``typing {nick}`` (at most once a second per member; never queued behind a full
queue); ``ping {}`` is answered with ``pong {}`` (a client that hears nothing for a while
checks its connection). A ``say`` that is blank or longer than ``MAX_TEXT`` characters, or
has a malformed id, and a nick that is taken or not a valid label, are refused with
``error {message, refused: "say" | "nick"}`` and the channel stays open; a record the
server cannot use closes the channel after ``error {message, closing: true}``. ``left``
says why: ``left`` (a leave, or the client closed the channel or its connection),
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
import hmac
import itertools
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field as dc_field
from typing import Any

from polymux.aio.session import Session
from polymux.apps.records import RecordError, field, read_record, write_record
from polymux.exceptions import PolymuxError, ProtocolError, SessionClosed


__all__ = [
    "MAX_ID",
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

MAX_ID = 64
"""Longest message id (characters)."""

TOKEN_LENGTH = (16, 128)
"""Shortest and longest join token (characters)."""

TYPING_EVERY = 1.0
"""Seconds between two ``typing`` notices relayed for one member (more are dropped)."""

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


def _count(record: dict[str, Any], name: str) -> int | None:
    """``record[name]`` as a count (an int >= 0), None if absent; raises ``ValueError``."""
    value = record.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a count of messages, got {value!r}")
    return value


class History:
    """The numbering and the recent ``msg`` and ``file`` records of each room, bounded.

    Records: at most ``per_room`` per room and ``max_bytes`` over all rooms, counting each
    record's strings in UTF-8 and 64 bytes more (the rooms whose last record is oldest lose
    their oldest records first). Numbering: each room counts its records from 1 under an
    *epoch*, a name unique to this History and this room's count; the counts of at most
    ``max_rooms`` rooms are remembered (the least recently active room is forgotten first,
    with its records), so a room that comes back after that starts a new epoch.
    """

    def __init__(self, per_room: int = 100, max_bytes: int = 4 << 20, max_rooms: int = 10_000) -> None:
        if per_room < 0 or max_bytes < 0 or max_rooms < 1:
            raise ValueError(
                f"history bounds must be >= 0 (max_rooms >= 1), got {per_room!r}, {max_bytes!r}, {max_rooms!r}"
            )
        self.per_room = per_room
        self.max_bytes = max_bytes
        self.max_rooms = max_rooms
        self.bytes = 0
        """What the kept records weigh (their strings in UTF-8, plus 64 bytes each)."""
        self._rooms: OrderedDict[str, deque[dict[str, Any]]] = OrderedDict()
        self._counts: OrderedDict[str, tuple[str, int]] = OrderedDict()
        """Room -> (epoch, last number), the most recently active room last."""
        self._instance = secrets.token_hex(4)  # epochs of another History (a restart) differ
        self._epochs = itertools.count(1)

    @staticmethod
    def _weight(record: dict[str, Any]) -> int:
        return 64 + sum(
            len(v.encode("utf-8", "surrogatepass")) for v in record.values() if isinstance(v, str)
        )

    def position(self, room: str) -> tuple[str, int]:
        """``(epoch, last number)`` of ``room`` (a room never numbered starts an epoch at 0)."""
        count = self._counts.get(room)
        if count is None:
            count = self._counts[room] = (f"{self._instance}.{next(self._epochs)}", 0)
            while len(self._counts) > self.max_rooms:
                self.forget(next(iter(self._counts)))
        else:
            self._counts.move_to_end(room)
        return count

    def number(self, room: str) -> int:
        """The next number of ``room`` (taken: each call gives the next)."""
        epoch, last = self.position(room)
        self._counts[room] = (epoch, last + 1)
        return last + 1

    def forget(self, room: str) -> None:
        """Drop ``room``'s numbering and records (it starts a new epoch if it comes back)."""
        self._counts.pop(room, None)
        for record in self._rooms.pop(room, ()):
            self.bytes -= self._weight(record)

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

    def since(self, room: str, epoch: object, after: int) -> tuple[list[dict[str, Any]], int | None]:
        """What a member that got ``room``'s records up to number ``after`` of ``epoch``
        missed: the records it still holds (oldest first), and how many more it no longer
        holds (None when ``epoch`` is not the room's: their number is unknown)."""
        current, last = self.position(room)
        kept = list(self._rooms.get(room, ()))
        if epoch != current:
            return kept, None
        after = min(after, last)
        missed = [record for record in kept if record.get("seq", 0) > after]
        return missed, last - after - len(missed)


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
    token: str | None = None
    """The join's token: a later join with the same nick and token replaces this member."""
    typed: float = float("-inf")
    """When a ``typing`` notice of this member was last relayed (``time.monotonic()``)."""


class ChatServer:
    """The chat server's channel handler: ``polymux.start_server(server.handle, ...)``.

    ``queue_size`` bounds each member's queue (records); ``policy`` is ``"disconnect"`` or
    ``"drop"`` (see the module docstring); ``log(line)`` gets one line per event;
    ``history`` records kept per room for ``join {history: N}`` and catching up, in at most
    ``history_bytes`` over all rooms; ``max_rooms``: rooms whose numbering is remembered;
    ``max_ids``: message ids remembered (over all rooms) to drop a message sent twice.
    """

    def __init__(
        self,
        *,
        queue_size: int = 256,
        policy: str = "disconnect",
        log: Callable[[str], None] | None = None,
        history: int = 100,
        history_bytes: int = 4 << 20,
        max_rooms: int = 10_000,
        max_ids: int = 16_384,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size!r}")
        if max_ids < 0:
            raise ValueError(f"max_ids must be >= 0, got {max_ids!r}")
        self.queue_size = queue_size
        self.policy = policy
        self.log = log or (lambda line: print(line, flush=True))
        self.rooms: dict[str, dict[str, Member]] = {}
        """Room name -> nick -> member."""
        self.evicted = 0
        """Members removed by the ``disconnect`` policy."""
        self.history = History(history, history_bytes, max_rooms)
        """The numbering and the recent messages of each room."""
        self.max_ids = max_ids
        self._ids: OrderedDict[tuple[str, str], int] = OrderedDict()
        """(room, message id) -> its number, the newest last."""
        self.duplicates = 0
        """Messages dropped because their id was said already (a resend)."""

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
                token = join.get("token")
                if token is not None and not (
                    isinstance(token, str)
                    and TOKEN_LENGTH[0] <= len(token) <= TOKEN_LENGTH[1]
                    and token.isascii()
                    and token.isprintable()
                ):
                    raise ValueError(
                        f"token must be {TOKEN_LENGTH[0]} to {TOKEN_LENGTH[1]} printable ASCII characters"
                    )
                holder = self.rooms.get(room, {}).get(nick)
                if holder is not None and not _same(holder.token, token):
                    raise ValueError(f"nick {nick!r} is taken in room {room!r}")
                wanted = _count(join, "history") or 0
                since = _count(join, "since")
            except ValueError as exc:
                self.log(f"refused: join from {peer}: {exc}")
                write_record(writer, {"type": "error", "message": str(exc), "refused": "join"})
                await writer.drain()
                return
            if holder is not None:
                self._replace(holder, peer)
            member = self._join(
                room, nick, peer, writer, wanted, since, join.get("epoch"), token, quiet=holder is not None
            )
            while (record := await read_record(reader)) is not None:
                kind = record["type"]
                if kind == "say":
                    self._say(member, field(record, "text", str), record.get("id"))
                    # Let the members' writers run before the next record: a burst read at
                    # once must not fill the queues of members that keep up.
                    await asyncio.sleep(0)
                elif kind == "typing":
                    self._typing(member)
                elif kind == "ping":
                    self._enqueue(member, {"type": "pong"})
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

    def _say(self, member: Member, text: str, message_id: object = None) -> None:
        if not text.strip():
            self._refuse(member, "say", "an empty message was not sent")
            return
        if len(text) > MAX_TEXT:
            self._refuse(
                member, "say", f"a message of {len(text):,} characters was not sent (at most {MAX_TEXT:,})"
            )
            return
        if message_id is not None and not (isinstance(message_id, str) and 0 < len(message_id) <= MAX_ID):
            self._refuse(
                member, "say", f"a message id is a string of 1 to {MAX_ID} characters, got {message_id!r}"
            )
            return
        if message_id is not None:
            said = self._ids.get((member.room, message_id))
            if said is not None:  # sent again after a lost connection: relayed once already
                self.duplicates += 1
                self._enqueue(
                    member, {"type": "duplicate", "room": member.room, "id": message_id, "seq": said}
                )
                return
        seq = self.history.number(member.room)
        record: dict[str, Any] = {
            "type": "msg",
            "room": member.room,
            "nick": member.nick,
            "text": text,
            "seq": seq,
            "ts": time.time(),
        }
        if message_id is not None:
            record["id"] = message_id
            if self.max_ids:
                self._ids[(member.room, message_id)] = seq
                if len(self._ids) > self.max_ids:
                    self._ids.popitem(last=False)
        self.history.add(member.room, record)
        self._broadcast(member.room, record)

    def _typing(self, member: Member) -> None:
        now = time.monotonic()
        if now - member.typed < TYPING_EVERY:
            return
        member.typed = now
        notice = {"type": "typing", "room": member.room, "nick": member.nick}
        for other in list(self.rooms.get(member.room, {}).values()):
            # Only to members with room to spare: a typing notice never costs anyone their seat.
            if other is not member and not other.gone and other.queue.qsize() < self.queue_size // 2:
                other.queue.put_nowait(notice)

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
            "seq": self.history.number(room),
            "ts": time.time(),
        }
        self.history.add(room, record)
        self._broadcast(room, record)
        return True

    def _join(
        self,
        room: str,
        nick: str,
        peer: str,
        writer: asyncio.StreamWriter,
        history: int = 0,
        since: int | None = None,
        epoch: object = None,
        token: str | None = None,
        *,
        quiet: bool = False,
    ) -> Member:
        """Add the member; ``quiet``: the room is not told (it replaces its own earlier
        channel)."""
        members = self.rooms.setdefault(room, {})
        member = Member(nick, room, peer, writer, asyncio.Queue(self.queue_size), token=token)
        members[nick] = member
        current, last = self.history.position(room)
        member.backlog.append(
            {
                "type": "welcome",
                "room": room,
                "nick": nick,
                "members": sorted(members),
                "seq": last,
                "epoch": current,
            }
        )
        if since is not None:
            missed, lost = self.history.since(room, epoch, since)
            member.backlog.append({"type": "catchup", "room": room, "missed": len(missed), "lost": lost})
            member.backlog.extend({**record, "missed": True} for record in missed)
        else:
            member.backlog.extend(
                {**record, "history": True} for record in self.history.recent(room, history)
            )
        member.task = asyncio.get_running_loop().create_task(self._pump(member))
        if not quiet:
            self._broadcast(room, {"type": "joined", "room": room, "nick": nick}, exclude=member)
        note = "" if since is None else f", catching up after {since}"
        self.log(f"join: {nick} in #{room} from {peer} ({len(members)} members{note})")
        return member

    def _replace(self, old: Member, peer: str) -> None:
        """``old``'s client joined again (same nick and token) before its previous channel
        was seen to end: that channel goes, quietly (the member never left the room)."""
        old.gone = True
        members = self.rooms.get(old.room, {})
        if members.get(old.nick) is old:
            del members[old.nick]
        if old.task is not None:
            old.task.cancel()
        self.log(f"rejoin: {old.nick} in #{old.room} from {peer} (its channel from {old.peer} is closed)")
        with contextlib.suppress(Exception):
            message = f"you joined #{old.room} as {old.nick} again from another connection"
            write_record(old.writer, {"type": "error", "message": message, "closing": True, "replaced": True})
            old.writer.close()

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


def _same(held: str | None, offered: object) -> bool:
    """Whether a join's token is the one the nick's holder joined with (compared in
    constant time: the token is a secret)."""
    return held is not None and isinstance(offered, str) and hmac.compare_digest(held, offered)


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return str(peer) if peer else "unix socket"


class ChatClient:
    """A chat client on one session (any format, omnistreams over WebSocket included: each
    room is a channel pair): :meth:`join` rooms, :meth:`say`, and :meth:`read` what the
    server sends. It stays on its one session; :class:`polymux.apps.chatclient.ReconnectingChatClient`
    comes back after a lost connection."""

    def __init__(self, session: Session, nick: str) -> None:
        self.session = session
        self.nick = check_label("nick", nick)
        self.channels: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def join(
        self,
        room: str,
        *,
        history: int = 0,
        since: int | None = None,
        epoch: str | None = None,
        token: str | None = None,
    ) -> dict[str, Any]:
        """Join ``room`` (a new channel); return the welcome record. Raises
        ``ValueError`` with the server's message if it refuses. ``history``: how many of
        the room's recent messages to get (as ``msg`` records with ``history: true``,
        read with :meth:`read` after the welcome). ``since`` and ``epoch``: catch up
        after that number (a ``catchup`` record, then the missed records, each with
        ``missed: true``). ``token``: a secret of this client, so that joining again
        replaces the channel the server may still hold (see the module docstring)."""
        check_label("room", room)
        # A pair of streams on one-way formats (omnistreams): a room talks both ways.
        async with asyncio.timeout(self.session.config.handshake_timeout):
            reader, writer = await self.session.open_pair(CHANNEL_PREFIX + room)
        join: dict[str, Any] = {"type": "join", "room": room, "nick": self.nick}
        if history:
            join["history"] = history
        if since is not None:
            join["since"] = since
            join["epoch"] = epoch
        if token is not None:
            join["token"] = token
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

    async def say(self, room: str, text: str, *, message_id: str | None = None) -> None:
        """Send a message to ``room`` (waits on the channel's flow control); with
        ``message_id``, the server relays it once however often it is sent."""
        _reader, writer = self.channels[room]
        record = {"type": "say", "text": text}
        if message_id is not None:
            record["id"] = message_id
        write_record(writer, record)
        await writer.drain()

    async def send(self, room: str, record: dict[str, Any]) -> None:
        """Send any record on ``room``'s channel (``typing``, ``ping``)."""
        _reader, writer = self.channels[room]
        write_record(writer, record)
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
