"""A chat client that stays in its rooms: when its connection is lost (closed, reset, or
silently cut) it connects again with jittered, capped backoff, joins its rooms again, and
catches up on what it missed, each message once and in order (the records of
:mod:`polymux.apps.chat`).

* **Noticing a silent cut.** A connection can stop carrying bytes without ever being
  closed (a Wi-Fi drop, a NAT that forgot it). When nothing has arrived for
  ``ping_interval`` seconds the client sends ``ping`` and waits ``ping_timeout`` seconds
  for anything from the server; then it gives the connection up. It judges the server
  only while the application takes what arrives (a paused reader is not a dead server).
* **Backoff.** Attempts wait ``Backoff.delay(n)``: doubling from 0.5 s, at most 15 s, each
  drawn between half and all of that (so that clients cut at once do not return at once);
  ``retries`` attempts per outage (0: give up at once, as :class:`~polymux.apps.chat.ChatClient`).
* **Exactly once.** Each room remembers the last number it got and the welcome's epoch,
  and joins again with ``since``: the server sends what it still holds after that number
  (marked ``missed``) and counts what it no longer holds (``catchup {missed, lost}``). A
  record whose number was seen already is dropped. Each message said gets an id; one not
  yet confirmed (echoed by the room, or answered ``duplicate``) when the connection went
  is sent again once the room is joined again, and the server relays an id once.
* **The same nick.** The client joins with a token of its own, so its new channel
  replaces the one the server may still hold for it (the server had not noticed the cut).

Events (:meth:`ReconnectingChatClient.next_event`) are the server's records (``msg``,
``file``, ``joined``, ``left``, ``renamed``, ``typing``, ``catchup``, ``dropped``, ``error``,
the ``welcome`` of each rejoin with ``again: true``) and the client's own:
``disconnected {reason}``, ``reconnecting {attempt, attempts, delay, reason}``,
``reconnected {attempt}``, ``closed {room, reason, replaced}`` (the server closed a room:
not rejoined) and ``gave up {reason, attempts}``; ``None`` once the client is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from polymux.aio.session import Session
from polymux.apps.chat import ChatClient, check_label
from polymux.apps.records import RecordError
from polymux.exceptions import ChannelReset, PolymuxError, SessionClosed


__all__ = ["Backoff", "ReconnectingChatClient"]


@dataclass(frozen=True)
class Backoff:
    """Jittered, capped exponential backoff: attempt ``n`` (from 0) waits a time drawn
    uniformly between half and all of ``min(cap, first * 2**n)`` seconds."""

    first: float = 0.5
    """The first attempt's bound (seconds)."""
    cap: float = 15.0
    """No wait is longer (seconds)."""

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap:
            raise ValueError(f"backoff needs 0 < first <= cap, got {self.first!r}, {self.cap!r}")

    def bound(self, attempt: int) -> float:
        """The longest wait before attempt ``attempt`` (from 0)."""
        return min(self.cap, self.first * 2.0 ** min(attempt, 60))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The wait before attempt ``attempt`` (from 0), jittered."""
        bound = self.bound(attempt)
        return (rng or random).uniform(bound / 2, bound)


@dataclass
class _Room:
    name: str
    epoch: str | None = None
    last: int = 0
    """The last number received (msg and file records)."""
    live: bool = False
    """Joined on the current connection, and what was pending sent again."""
    pending: OrderedDict[str, tuple[str, int]] = field(default_factory=OrderedDict)
    """Message id -> (text, the connection it was last sent on), until confirmed."""


class ReconnectingChatClient:
    """A chat client on a session that it opens again when it is lost (see the module
    docstring).

    Args:
        connect: opens a session (e.g. ``lambda: polymux.connect(host, port, protocol=...)``;
            it should give up within a bound: attempts are counted by its failures).
        nick: the nick in every room.
        retries: attempts per outage before giving up (0: none).
        backoff: the waits between attempts.
        ping_interval: seconds without a record from the server before checking the
            connection with a ``ping`` (``None``: never check).
        ping_timeout: seconds the server has to answer anything after a ``ping``.
        join_timeout: seconds a join may take (a connection that dies while joining).
        history: recent messages to show when first joining a room (``history: true``).
        max_pending: bytes of text said and not yet confirmed; :meth:`say` waits beyond.
        max_events: events held for the application; the rooms' channels are not read
            beyond (the server's flow control then applies).
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[Session]],
        nick: str,
        *,
        retries: int = 10,
        backoff: Backoff | None = None,
        ping_interval: float | None = 15.0,
        ping_timeout: float = 10.0,
        join_timeout: float = 15.0,
        history: int = 0,
        max_pending: int = 4 << 20,
        max_events: int = 64,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries!r}")
        if ping_interval is not None and not ping_interval > 0:
            raise ValueError(f"ping_interval must be positive or None, got {ping_interval!r}")
        if not ping_timeout > 0:
            raise ValueError(f"ping_timeout must be positive, got {ping_timeout!r}")
        self._connect = connect
        self.nick = check_label("nick", nick)
        self.retries = retries
        self.backoff = backoff or Backoff()
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.join_timeout = join_timeout
        self.history = history
        self.max_pending = max_pending
        self.token = secrets.token_urlsafe(24)
        """This client's join token (a secret: it lets a new channel replace an old one)."""
        self.rooms: dict[str, _Room] = {}
        self.session: Session | None = None
        """The current session (None while reconnecting)."""
        self.client: ChatClient | None = None
        self.connections = 0
        """Sessions opened so far (the first included)."""
        self.outages = 0
        """Connections lost so far."""
        self._pending_count = 0
        self._pending_bytes = 0
        self.closed: dict[str, str] = {}
        """Rooms the server closed (not joined again), with its reason."""
        self._events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(max_events)
        self._lost: asyncio.Future[str] | None = None
        self._heard = 0.0  # set when the first connection goes live
        self._heard_event = asyncio.Event()
        self._confirmed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False
        self._finished = False

    # -- the application's side ------------------------------------------------------------

    async def start(self, rooms: list[str]) -> list[dict[str, Any]]:
        """Connect and join ``rooms``; return their welcomes. The first connection is not
        retried: its failure (and a refused join, ``ValueError``) goes to the caller."""
        for name in rooms:
            self.rooms.setdefault(check_label("room", name), _Room(name))
        session = self.session = await self._connect()
        self.connections += 1
        client = ChatClient(session, self.nick)
        welcomes = []
        for room in self.rooms.values():
            welcome = await client.join(room.name, history=self.history, token=self.token)
            self._welcomed(room, welcome)
            welcomes.append(welcome)
        self._go_live(session, client)
        for room in self.rooms.values():
            room.live = True
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())
        return welcomes

    async def say(self, room: str, text: str) -> str:
        """Say ``text`` in ``room``; returns its id. Sent now if the room is joined, else
        once it is joined again; waits while ``max_pending`` bytes are unconfirmed."""
        state = self.rooms[room]
        while self._pending_bytes + len(text) > self.max_pending and self._pending_count:
            self._confirmed.clear()
            await self._confirmed.wait()
        message_id = secrets.token_hex(8)
        state.pending[message_id] = (text, -1)
        self._pending_count += 1
        self._pending_bytes += len(text)
        if state.live and self.client is not None:
            await self._send(state, message_id)
        return message_id

    async def typing(self, room: str) -> None:
        """Tell ``room`` that we are typing (nothing while it is not joined)."""
        state = self.rooms[room]
        if state.live and self.client is not None:
            with contextlib.suppress(ConnectionError, PolymuxError, KeyError):
                await self.client.send(room, {"type": "typing"})

    async def next_event(self) -> dict[str, Any] | None:
        """The next event (see the module docstring); None once the client is done (it
        gave up, every room was closed, or :meth:`close`)."""
        if self._finished and self._events.empty():
            return None
        event = await self._events.get()
        if event is None:
            self._finished = True
        return event

    def __aiter__(self) -> ReconnectingChatClient:
        return self

    async def __anext__(self) -> dict[str, Any]:
        event = await self.next_event()
        if event is None:
            raise StopAsyncIteration
        return event

    @property
    def pending(self) -> int:
        """Messages said and not yet confirmed by the server."""
        return self._pending_count

    async def delivered(self) -> None:
        """Wait until every message said is confirmed (echoed by its room, or answered
        ``duplicate``)."""
        while self._pending_count:
            self._confirmed.clear()
            await self._confirmed.wait()

    async def close(self) -> None:
        """Leave every room, close the session, stop reconnecting."""
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        client, session = self.client, self.session
        self._stop_tasks()
        try:
            # A dead connection's flow control could hold the goodbyes: bounded.
            async with asyncio.timeout(self.join_timeout):
                if client is not None:
                    for room in list(client.channels):
                        with contextlib.suppress(ConnectionError, PolymuxError):
                            await client.leave(room)
                if session is not None:
                    with contextlib.suppress(ConnectionError, PolymuxError):
                        await session.aclose()
        except TimeoutError:
            if session is not None:
                session.abort()
        self._finish()

    # -- inside ------------------------------------------------------------------------------

    def _confirm(self, room: _Room, message_id: object) -> None:
        """``message_id`` reached the room (or never will: its room is closed)."""
        said = room.pending.pop(message_id, None) if isinstance(message_id, str) else None
        if said is not None:
            self._pending_count -= 1
            self._pending_bytes -= len(said[0])
            self._confirmed.set()

    def _finish(self) -> None:
        if not self._finished:
            self._finished = True
            with contextlib.suppress(asyncio.QueueFull):
                self._events.put_nowait(None)  # a full queue: next_event sees _finished once drained

    async def _emit(self, event: dict[str, Any]) -> None:
        await self._events.put(event)

    async def _send(self, room: _Room, message_id: str) -> None:
        text, _ = room.pending[message_id]
        room.pending[message_id] = (text, self.connections)
        client = self.client
        if client is None:
            return
        with contextlib.suppress(ConnectionError, PolymuxError, KeyError):
            await client.say(room.name, text, message_id=message_id)  # lost: sent again later

    @staticmethod
    def _welcomed(room: _Room, welcome: dict[str, Any]) -> None:
        """A first join: the room's numbering starts at the welcome's (the history records
        that follow are older, and shown as history)."""
        epoch, seq = welcome.get("epoch"), welcome.get("seq")
        room.epoch = epoch if isinstance(epoch, str) else None
        room.last = seq if isinstance(seq, int) else 0

    def _go_live(self, session: Session, client: ChatClient) -> None:
        self.session, self.client = session, client
        self._lost = asyncio.get_running_loop().create_future()
        self._heard = _now()
        for name in client.channels:
            self._spawn(self._read_room(self.rooms[name], client, self._lost))
        if self.ping_interval is not None:
            self._spawn(self._watch(client, self._lost))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stop_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _give_up_connection(self, lost: asyncio.Future[str], reason: str) -> None:
        if not lost.done():
            lost.set_result(reason)

    def _heard_now(self) -> None:
        self._heard = _now()
        self._heard_event.set()

    async def _deliver(self, room: _Room, record: dict[str, Any]) -> None:
        """One record of ``room``: numbered records once each, confirmations applied."""
        kind = record.get("type")
        if kind == "pong":
            return
        if kind in ("msg", "file"):
            seq = record.get("seq")
            if isinstance(seq, int):
                if seq <= room.last and not record.get("history"):
                    return  # seen already (exactly once)
                room.last = max(room.last, seq)
            if kind == "msg":
                self._confirm(room, record.get("id"))
        elif kind == "duplicate":
            self._confirm(room, record.get("id"))
        await self._emit(record)

    async def _read_room(self, room: _Room, client: ChatClient, lost: asyncio.Future[str]) -> None:
        """Read ``room``'s channel until it ends: a lost connection ends this connection
        (reconnect); the server closing the room ends the room."""
        reason: str | None = None  # the server's, when it closes the room on purpose
        replaced = False
        session = client.session
        try:
            while True:
                record = await client.read(room.name)
                if record is None:
                    break
                self._heard_now()
                if record.get("type") == "error" and record.get("closing"):
                    reason = str(record.get("message") or "the server closed the room")
                    replaced = bool(record.get("replaced"))
                    continue
                await self._deliver(room, record)
        except ChannelReset as exc:
            # This channel only (the slow-member policy), unless the session goes too.
            reason = reason or f"the server closed the room ({exc})"
        except (ConnectionError, PolymuxError, RecordError, OSError) as exc:
            if isinstance(exc, SessionClosed) or session.is_closed:
                self._give_up_connection(lost, _why(session, exc))
                return
            reason = reason or f"the server closed the room ({exc})"
        if reason is None and not session.is_closed:
            # The channel ended without a word: a server going away ends its channels
            # first, then the session. Give it a moment to tell them apart.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ping_timeout):
                    await session.wait_closed()
        if lost.done() or session.is_closed:
            self._give_up_connection(lost, _why(session, None))
            return
        reason = reason or "the server closed the room"
        # The server ended this room only (a refusal, the slow-member policy, replaced).
        client.channels.pop(room.name, None)
        await self._close_room(room, reason, replaced)
        if not self.rooms:
            self._give_up_connection(lost, "")
            self._closing = True

    async def _close_room(self, room: _Room, reason: str, replaced: bool = False) -> None:
        """The server closed ``room``: it is not joined again, and what we said there and
        was not confirmed never will be."""
        room.live = False
        self.rooms.pop(room.name, None)
        self.closed[room.name] = reason
        for message_id in list(room.pending):
            self._confirm(room, message_id)
        await self._emit({"type": "closed", "room": room.name, "reason": reason, "replaced": replaced})

    async def _watch(self, client: ChatClient, lost: asyncio.Future[str]) -> None:
        """Check the connection when the server has been quiet for ``ping_interval``."""
        assert self.ping_interval is not None
        while not lost.done():
            quiet = _now() - self._heard
            if quiet < self.ping_interval:
                await asyncio.sleep(self.ping_interval - quiet)
                continue
            if self._events.full():  # the application is behind: the server is not to blame
                self._heard_now()
                continue
            rooms = [name for name in client.channels if self.rooms.get(name, _Room("")).live]
            if not rooms:
                self._heard_now()
                continue
            self._heard_event.clear()
            asked = _now()
            # The answer (or anything else) within ping_timeout; a send stuck on a dead
            # connection's flow control counts against the same time.
            with contextlib.suppress(TimeoutError, ConnectionError, PolymuxError, KeyError):
                async with asyncio.timeout(self.ping_timeout):
                    await client.send(rooms[0], {"type": "ping"})
                    await self._heard_event.wait()
            if self._heard < asked and not self._events.full():
                silent = _now() - self._heard
                self._give_up_connection(lost, f"no answer from the server for {silent:.0f} s")
                client.session.abort()
                return

    async def _supervise(self) -> None:
        """Wait for the connection to go, then bring it back (or give up)."""
        while True:
            assert self._lost is not None
            reason = await self._lost
            self._stop_tasks()
            for room in self.rooms.values():
                room.live = False
            if self.session is not None:
                self.session.abort()
            self.session = self.client = None
            if self._closing or not self.rooms:
                self._finish()
                return
            self.outages += 1
            await self._emit({"type": "disconnected", "reason": reason})
            if not await self._reconnect(reason):
                return

    async def _reconnect(self, reason: str) -> bool:
        for attempt in range(1, self.retries + 1):
            delay = self.backoff.delay(attempt - 1)
            await self._emit(
                {
                    "type": "reconnecting",
                    "attempt": attempt,
                    "attempts": self.retries,
                    "delay": delay,
                    "reason": reason,
                }
            )
            await asyncio.sleep(delay)
            try:
                session = await self._connect()
            except Exception as exc:  # noqa: BLE001 - any failure is a failed attempt, said
                reason = str(exc) or type(exc).__name__
                continue
            self.connections += 1
            try:
                client, caught = await self._rejoin(session)
            except (ConnectionError, PolymuxError, RecordError, OSError, TimeoutError) as exc:
                session.abort()
                reason = _why(session, exc)
                continue
            if not self.rooms:  # every room refused us
                session.abort()
                self._finish()
                return False
            await self._emit({"type": "reconnected", "attempt": attempt})
            await self._catch_up(client, caught)
            return True
        await self._emit({"type": "gave up", "reason": reason, "attempts": self.retries})
        self._finish()
        return False

    async def _rejoin(self, session: Session) -> tuple[ChatClient, list[tuple[_Room, list[dict[str, Any]]]]]:
        """Join every room again on ``session``; each room's welcome, catch-up summary and
        missed records (a room that refuses us is closed)."""
        client = ChatClient(session, self.nick)
        caught: list[tuple[_Room, list[dict[str, Any]]]] = []
        for room in list(self.rooms.values()):
            try:
                async with asyncio.timeout(self.join_timeout):
                    welcome = await client.join(
                        room.name, since=room.last, epoch=room.epoch, token=self.token
                    )
                    records = [welcome]
                    summary = await client.read(room.name)
                    if summary is None or summary.get("type") != "catchup":
                        raise RecordError(f"expected catchup after the welcome, got {summary!r}")
                    records.append(summary)
                    for _ in range(int(summary.get("missed") or 0)):
                        record = await client.read(room.name)
                        if record is None:
                            raise RecordError("the server closed the room while catching up")
                        records.append(record)
            except ValueError as exc:  # refused (the nick went to someone else ...)
                if isinstance(exc, RecordError):
                    raise
                await self._close_room(room, str(exc))
                continue
            caught.append((room, records))
        return client, caught

    async def _catch_up(self, client: ChatClient, caught: list[tuple[_Room, list[dict[str, Any]]]]) -> None:
        """Deliver what each room caught up, go live, then send again what was not
        confirmed."""
        for room, records in caught:
            welcome, *rest = records
            epoch, seq = welcome.get("epoch"), welcome.get("seq")
            if epoch != room.epoch:
                # A new numbering (the server restarted): all it holds is new to us.
                room.epoch = epoch if isinstance(epoch, str) else None
                room.last = 0
            await self._emit({**welcome, "again": True})
            for record in rest:
                await self._deliver(room, record)
            if isinstance(seq, int):
                room.last = max(room.last, seq)  # what it no longer holds is counted as lost
        self._go_live(client.session, client)
        for room, _ in caught:
            # Said while away, or sent on the lost connection and not confirmed: send
            # again (the server drops an id it relayed already). New says wait meanwhile.
            while unsent := [i for i, (_, sent) in room.pending.items() if sent != self.connections]:
                for message_id in unsent:
                    if message_id in room.pending:
                        await self._send(room, message_id)
            room.live = True


def _now() -> float:
    """The running loop's clock, which its sleeps and timeouts use."""
    return asyncio.get_running_loop().time()


def _why(session: Session, exc: BaseException | None) -> str:
    """Why ``session`` ended, in a few words."""
    error = session.exception or exc
    if error is None:
        return "the server closed the connection"
    return str(error) or type(error).__name__
