"""The data plane's receiving half: data frames into each channel's :class:`Inbox`.

An engine's ``_receive`` decodes a read and hands every data frame to one :class:`DataRuns`
(the engine's, reused for every read). A channel whose reader is a stream (``read()``,
``receive()``) has an :class:`Inbox`, attached to its engine record by the session core:
its frames' payloads go straight in (copied once), with no event, no core call and no
driver call per frame. Frames of other channels (plain protocols, requests' answers,
channels whose application closed its reading) become ``DataReceived`` events, consecutive
frames of one channel collected into one, as before.

What the inbox does not do per frame, it does per read or per batch of consumption: the
core adds the bytes received to its memory budget once per read
(:attr:`DataRuns.received`), wakes the readers waiting (:attr:`DataRuns.woken`) and applies
the slow-reader policy to the inboxes that passed their limit (:attr:`DataRuns.behind`).
The reader reports what the application consumed (:meth:`Inbox.consume`) once it reaches
:attr:`Inbox.report_at` (the credit the format would send then, see
:meth:`~polymux.engine.base.Engine.credit_step`), or at once while the core wants every
byte counted (:attr:`Plane.eager`: reading paused for memory or a slow reader).

Nothing here knows of asyncio or anyio: an inbox's :attr:`Inbox.owner` is whatever the
driver wakes (its reader), and :attr:`Plane.on_report` is the driver's "report soon" hook.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from polymux._types import BytesLike
from polymux.engine.events import DataReceived, Event


if TYPE_CHECKING:
    from polymux.engine.channel import ChannelRecord


__all__ = ["KEEP_VIEW", "NO_CREDIT_STEP", "DataRuns", "Inbox", "Plane"]

NO_CREDIT_STEP = 64 * 1024
"""Consumed bytes an inbox collects before reporting them, on a format without credit on
the wire (the reports only bring the memory budget and the slow-reader check up to date;
the core asks for every byte at once while either matters: :attr:`Plane.eager`)."""


KEEP_VIEW = 5
"""A payload that is at least 1/KEEP_VIEW of the (immutable) read it arrived in is kept
as a view of it, not copied: the read stays alive until the reader took it, so what a
channel pins is at most KEEP_VIEW times what it counts; smaller payloads are copied (a
view would pin a whole read for a few bytes). The reader copies each byte once, when it
takes it (``read()`` returns ``bytes``). 5: a socket read of 256 KiB holds four 64 KiB
frames and their headers, each a little under a quarter of it."""


class Plane:
    """What the inboxes of one session share: the list of inboxes with consumption to
    report, and the driver's hook that schedules the report."""

    __slots__ = ("eager", "on_report", "reports")

    def __init__(self) -> None:
        self.reports: list[Inbox] = []
        """Inboxes with consumed bytes to report (each at most once)."""
        self.eager = False
        """Report every consumed byte at once (the core needs exact counts now)."""
        self.on_report: Callable[[], None] | None = None
        """Called when :attr:`reports` gets its first inbox: the driver takes them soon
        (``SessionCore.report``), on a later turn of its loop."""

    def report(self, inbox: Inbox) -> None:
        """``inbox`` has consumption to report."""
        if inbox.reporting:
            return
        inbox.reporting = True
        reports = self.reports
        reports.append(inbox)
        if len(reports) == 1 and self.on_report is not None:
            self.on_report()

    def take(self) -> list[Inbox]:
        """The inboxes to report, forgotten here."""
        reports, self.reports = self.reports, []
        for inbox in reports:
            inbox.reporting = False
        return reports


class Inbox:
    """One channel's received bytes until its application reads them.

    ``parts`` holds the payloads in order (``bytes``, or views of the immutable reads they
    arrived in, see :data:`KEEP_VIEW`); the reader takes them (:meth:`take`: one copy at
    most) or moves them into a buffer of its own (:meth:`take_all`). ``unconsumed`` counts every byte received
    and not yet consumed, wherever it is now (here or in the reader's buffer); ``pending``
    what was consumed and not yet reported to the core.
    """

    __slots__ = (
        "behind",
        "behind_at",
        "handle",
        "owner",
        "parts",
        "pending",
        "plane",
        "report_at",
        "report_on_wait",
        "reporting",
        "size",
        "unconsumed",
        "waiting",
    )

    def __init__(self, plane: Plane, handle: int) -> None:
        self.plane = plane
        self.handle = handle
        self.parts: deque[BytesLike] = deque()
        self.size = 0
        """Bytes in :attr:`parts`."""
        self.unconsumed = 0
        self.pending = 0
        self.report_at = 1
        """Report consumption once :attr:`pending` reaches this (the core sets it)."""
        self.report_on_wait = False
        """Report what was consumed when the reader waits (:attr:`report_at` is an
        estimate: ``Engine.credit_estimated``)."""
        self.behind_at = 1 << 62
        """Unconsumed bytes past which the reader is behind (formats without credit:
        ``receive_window``; the core sets it)."""
        self.behind = False
        """Reported behind, not yet seen by the core."""
        self.reporting = False
        """In the plane's :attr:`Plane.reports`."""
        self.waiting = False
        """The reader waits for data: wake :attr:`owner` when some arrives."""
        self.owner: Any = None
        """The driver's reader (what it wakes)."""

    def __repr__(self) -> str:
        return f"<Inbox #{self.handle} size={self.size} unconsumed={self.unconsumed} pending={self.pending}>"

    def take(self, n: int) -> bytes:
        """Up to ``n`` (> 0) bytes from the front, consumed, copied once at most: a part as
        it is when it fits (or the front of a larger one), small parts joined up to ``n``.
        There must be some."""
        parts = self.parts
        first = parts[0]
        size = len(first)
        if size > n:
            view = first if first.__class__ is memoryview else memoryview(first)
            parts[0] = view[n:]  # the rest stays a view: no copy of it per read
            data = bytes(view[:n])
        elif size == n or len(parts) == 1 or size + len(parts[1]) > n:
            parts.popleft()
            data = first if first.__class__ is bytes else bytes(first)
        else:
            out = [parts.popleft()]
            while parts and size + len(parts[0]) <= n:
                part = parts.popleft()
                out.append(part)
                size += len(part)
            data = b"".join(out)
        got = len(data)
        self.size -= got
        self.unconsumed -= got
        pending = self.pending + got
        self.pending = pending
        if pending >= self.report_at or self.plane.eager:
            self.plane.report(self)
        return data

    def add(self, data: BytesLike, more: tuple[BytesLike, ...], n: int) -> None:
        """Hold ``n`` bytes (``data`` then ``more``, copied) already counted in
        :attr:`unconsumed`."""
        parts = self.parts
        parts.append(bytes(data))
        for part in more:
            parts.append(bytes(part))
        self.size += n

    def waits(self) -> None:
        """The reader waits for data: wake it when some arrives (and report what it
        consumed, where :attr:`report_on_wait`)."""
        self.waiting = True
        if self.report_on_wait and self.pending:
            self.plane.report(self)

    def take_all(self) -> list[BytesLike]:
        """Every part, not consumed yet (the reader moves them into its own buffer)."""
        parts = list(self.parts)
        self.parts.clear()
        self.size = 0
        return parts

    def consume(self, n: int) -> None:
        """The application consumed ``n`` bytes the reader held in its own buffer."""
        self.unconsumed -= n
        pending = self.pending + n
        self.pending = pending
        if pending >= self.report_at or self.plane.eager:
            self.plane.report(self)

    def drop(self) -> int:
        """Forget every byte held and unconsumed; returns how many were unconsumed
        (dropped bytes are credited as consumed by the caller)."""
        self.parts.clear()
        self.size = 0
        n, self.unconsumed = self.unconsumed, 0
        return n


class DataRuns:
    """An engine's receiving side: each data frame to its channel's inbox, or into a
    ``DataReceived`` event (see the module docstring). One per engine, reused.

    The engine calls :meth:`add` per data frame and :meth:`flush` before it appends any
    other event to :attr:`events`, so events keep the wire's order (a run of frames of
    one channel without an inbox is one event).
    """

    __slots__ = ("behind", "chunks", "events", "length", "received", "record", "woken")

    def __init__(self, events: list[Event] | None = None) -> None:
        self.events: list[Event] = [] if events is None else events
        self.record: ChannelRecord | None = None
        self.chunks: list[BytesLike] = []
        self.length = 0
        self.received = 0
        """Bytes put in inboxes since the core last took the count."""
        self.woken: list[Inbox] = []
        """Inboxes whose reader waited and now has data."""
        self.behind: list[Inbox] = []
        """Inboxes that passed :attr:`Inbox.behind_at`."""

    def add(self, record: ChannelRecord, payload: BytesLike, n: int) -> None:
        """``n`` bytes of ``record``'s data arrived (``payload``; may be a view)."""
        inbox = record.inbox
        if inbox is not None:  # (another channel's run may be pending: no matter, its own order holds)
            if payload.__class__ is not bytes and (
                payload.__class__ is not memoryview
                or payload.obj.__class__ is not bytes
                or n * KEEP_VIEW < len(payload.obj)
            ):
                payload = bytes(payload)
            inbox.parts.append(payload)
            inbox.size += n
            unconsumed = inbox.unconsumed + n
            inbox.unconsumed = unconsumed
            self.received += n
            if inbox.waiting:
                inbox.waiting = False
                self.woken.append(inbox)
            if unconsumed > inbox.behind_at and not inbox.behind:
                inbox.behind = True
                self.behind.append(inbox)
            return
        if record is self.record:
            self.chunks.append(payload)
            self.length += n
            return
        if self.record is not None:
            self.flush()
        self.record, self.chunks, self.length = record, [payload], n

    def put(self, inbox: Inbox, data: BytesLike, more: tuple[BytesLike, ...], n: int) -> None:
        """``n`` bytes for ``inbox`` that came as an event (``data`` then ``more``): the
        core's path for data an engine reported as an event of its own."""
        inbox.add(data, more, n)
        inbox.unconsumed += n
        self.received += n
        if inbox.waiting:
            inbox.waiting = False
            self.woken.append(inbox)
        if inbox.unconsumed > inbox.behind_at and not inbox.behind:
            inbox.behind = True
            self.behind.append(inbox)

    def flush(self) -> None:
        """Emit the pending run, if any."""
        record = self.record
        if record is not None:
            chunks = self.chunks
            self.events.append(DataReceived(record.handle, chunks[0], self.length, tuple(chunks[1:])))
            self.record = None
            self.chunks = []

    def take_events(self) -> list[Event]:
        """The events of the read (the run flushed), forgotten here."""
        if self.record is not None:
            self.flush()
        events = self.events
        if events:
            self.events = []
        return events
