"""What every format's frame-record walk is built from (bytes in, frame records out).

Each format's module (:mod:`polymux.formats.yamux` ...) defines a :class:`Walk` over its
own codec (:mod:`polymux.wire`): how to make a codec per direction, the size of a decoded
frame, and the records of a frame, following the engines' rules only as far as a bystander
can (channel keys, frame types and the credit each direction has left). A walk may also
know the common shapes of its frame headers (:meth:`Walk.fast_header`,
:meth:`Walk.fast_record`, :meth:`Walk.fast_run`): the decoder's live path (what
``CaptureRecorder(mode="records")`` runs) then walks them without the codec, skipping data
payloads. The decoder that drives a walk, and everything all formats share (offsets,
replays, violations, truncation), is :class:`polymux.tracing.FrameDecoder`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from polymux.engine.flow import SendCredit
from polymux.formats.records import C2S, S2C, FrameRecord


if TYPE_CHECKING:
    from polymux.formats.columns import RecordColumns


__all__ = [
    "OTHER",
    "PREFIX",
    "Codec",
    "Credit",
    "Elided",
    "FastHeader",
    "FrameWalk",
    "Generations",
    "Violation",
    "Walk",
    "WalkHost",
    "new_record",
]

OTHER = {C2S: S2C, S2C: C2S}
"""The other direction."""

PREFIX = {C2S: "c", S2C: "s"}
"""Channel keys of formats whose sides number their own channels start with who opened
the channel: ``c`` the client, ``s`` the server."""

new_record = tuple.__new__
"""Builds a :class:`FrameRecord` from a tuple of its 14 fields, without the NamedTuple's
own ``__new__`` (a Python function: 4x slower, and records are built once per frame)."""


class Elided:
    """A data frame's payload of which only the first bytes were kept (the live path):
    ``len()`` is the payload's length, ``bytes()`` the kept bytes."""

    __slots__ = ("head", "length")

    def __init__(self, head: bytes, length: int) -> None:
        self.head = head
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __bytes__(self) -> bytes:
        return self.head


FastHeader = tuple[int, int, bool, tuple[Any, ...]]
"""What :meth:`Walk.fast_header` returns for a frame it knows: ``(header length,
payload length, data, fields)``; ``data``: the payload is application data (only a prefix
is kept); ``fields`` go to :meth:`Walk.fast_item`."""


class Codec(Protocol):
    """What the decoder needs of a per-direction codec: ``feed`` and ``pending``."""

    def feed(self, data: bytes) -> list[Any]: ...

    @property
    def pending(self) -> int: ...


class Violation(Exception):
    """A walk found the frame breaks the protocol (beyond what the codec checks);
    ``records`` are those the frame gave before the violation."""

    def __init__(self, message: str, records: list[FrameRecord] | None = None) -> None:
        super().__init__(message)
        self.records = records or []


class WalkHost(Protocol):
    """What a walk needs of the decoder that drives it."""

    format: str
    """The format's name (the records' ``format``)."""
    session: str
    """The records' ``session``."""
    one_way: bool
    """Only one direction was captured: credit is not followed (``None``), and a format
    whose sides negotiate assumes the other side agreed."""

    def release(self, direction: str) -> None:
        """Bytes held by ``direction``'s codec can now be decoded (a walk says so from
        inside the other direction's feed, e.g. once a negotiation completes)."""


class Walk:
    """A format's frame-record walk: its codecs per direction, frame sizes, and frames ->
    records, followed as far as a bystander can (channel keys, frame types, the credit each
    direction has left). The decoder (:class:`~polymux.tracing.FrameDecoder`) owns what all
    formats share: offsets, replays, violations, truncation, the live path's loop."""

    fmt: str = ""

    def __init__(self, decoder: WalkHost) -> None:
        self.decoder = decoder
        self.fmt = decoder.format
        self.channel_names: dict[str, str] = {}
        """Channel key -> name, from the frame that opened the channel (formats with names)."""

    def codec(self, direction: str) -> Codec:
        """A fresh codec for ``direction`` in its state at the last frame boundary."""
        raise NotImplementedError

    def size(self, item: Any) -> int:
        """The encoded size of ``item`` if it used the minimal encoding."""
        raise NotImplementedError

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        """Records for one decoded item. May raise :class:`Violation`."""
        raise NotImplementedError

    def truncated_detail(self, direction: str) -> str:
        """What an unfinished direction was in the middle of."""
        return "frame"

    # The live path (optional per format): walk frame headers without the codec.

    MAX_HEAD = 0
    """The longest header :meth:`fast_header` reads (0: no live path, the codec decodes)."""

    def fast_header(self, direction: str, buf: Any, pos: int, end: int) -> FastHeader | bool | None:
        """The frame at ``buf[pos:end]``, if its header has a shape this walk knows and
        the codec would accept: a :data:`FastHeader`; ``None`` if the header is cut short
        (``end`` comes first, with fewer than :attr:`MAX_HEAD` bytes); ``False`` for
        anything else (the codec takes over from this frame)."""
        return False

    def fast_item(self, fields: tuple[Any, ...], payload: Any) -> Any:
        """The codec's item for a walked frame: ``fields`` from :meth:`fast_header`, the
        whole payload (``bytes``), or an :class:`Elided` one for data frames."""
        raise NotImplementedError

    def fast_record(
        self,
        direction: str,
        fields: tuple[Any, ...],
        data: bool,
        length: int,
        kept: bytes,
        offset: int,
        time_ns: int,
    ) -> FrameRecord | None:
        """The one record of a walked frame of the most common kinds (plain data of
        ``length`` payload bytes; a credit grant, ``kept`` its whole payload), or ``None``
        (having changed no state) when the frame needs :meth:`records` (it opens or ends a
        channel, breaks the credit ...). The bulk of a capture goes this way."""
        return None

    def payload(self, item: Any) -> Any:
        """The payload of a decoded item (for the records' payload prefix)."""
        return b""

    def fast_run(
        self,
        direction: str,
        buf: Any,
        pos: int,
        end: int,
        offset: int,
        time_ns: int,
        out: list[FrameRecord],
        payloads: list[bytes | None] | None,
        prefix: int,
    ) -> int:
        """Records of the whole frames from ``buf[pos:]`` on (``offset``: the stream offset
        of ``pos``) as long as they are of the most common kinds, each exactly as
        :meth:`records` would give it (and its payload prefix, when ``payloads`` is given):
        one loop over many frames, for chunks that hold many. Returns where it stopped (at
        a frame boundary: a frame it leaves to the general path, or one not whole in
        ``buf``)."""
        return pos

    COLUMN_RUN_MIN = 256
    """Frames a vectorised run must hold to be worth its fixed cost (:meth:`column_run`)."""

    def column_run(
        self,
        direction: str,
        buf: Any,
        pos: int,
        end: int,
        offset: int,
        time_ns: int,
        columns: RecordColumns,
    ) -> int:
        """:meth:`fast_run` vectorised (optional per format): the records of the whole
        frames from ``buf[pos:]`` on, as long as they are of the most common kinds, go into
        ``columns`` (numpy over all their headers at once; only finding where
        each frame starts is a loop, ``polymux.formats.scan``), each exactly as
        :meth:`records` would give it. Returns where it stopped, at a frame boundary; ``pos``
        (nothing taken, nothing changed) when fewer than :attr:`COLUMN_RUN_MIN` frames
        would go this way (:meth:`fast_run` is cheaper for a few)."""
        return pos

    # helpers

    def rec(
        self,
        direction: str,
        time_ns: int,
        offset: int,
        channel: str,
        frame_type: str,
        length: int = 0,
        flags: int = 0,
        credit: int | None = None,
        credit_dir: str = "",
        ping_id: int | None = None,
        error: str | None = None,
    ) -> FrameRecord:
        """A record of this walk's session and format (no credit where only one direction
        is decoded)."""
        if self.decoder.one_way:
            credit, credit_dir = None, ""
        # tuple.__new__: a NamedTuple's own __new__ is a Python function, 4x slower, and
        # this runs once per frame
        return new_record(
            FrameRecord,
            (
                self.decoder.session,
                direction,
                time_ns,
                self.fmt,
                offset,
                channel,
                frame_type,
                length,
                flags,
                credit,
                credit_dir,
                ping_id,
                error,
                self.channel_names.get(channel) if channel else None,
            ),
        )


Credit = SendCredit
"""One direction's send credit on one channel, as the engines count it (``left``: the
window minus what is in flight, negative once a sender overran it)."""


class Generations:
    """Channel keys for formats whose ids are reused: ``c3``, then ``c3#2`` ..."""

    def __init__(self) -> None:
        self.current: dict[str, str] = {}
        self.count: dict[str, int] = {}

    def new(self, key: str) -> str:
        """The key of a channel opened (again) under ``key``."""
        n = self.count.get(key, 0) + 1
        self.count[key] = n
        name = key if n == 1 else f"{key}#{n}"
        self.current[key] = name
        return name

    def get(self, key: str) -> str:
        """The key of the channel live under ``key`` (``key`` itself if none was opened)."""
        return self.current.get(key, key)


class FrameWalk(Walk):
    """A walk that follows no credit and gives one record per frame: for formats whose
    frames map to records one to one. A subclass provides :meth:`codec` and
    :meth:`frame`."""

    def frame(self, item: Any) -> tuple[int, int | None, str, int, int]:
        """``(size on the wire, channel id or None, frame type, length, flags)`` of a
        decoded frame."""
        raise NotImplementedError

    def size(self, item: Any) -> int:
        """The frame's size on the wire (:meth:`frame`)."""
        return self.frame(item)[0]

    def payload(self, item: Any) -> Any:
        """The frame's ``body``, if it has one."""
        return getattr(item, "body", b"")  # the codec's frame type: a body, or nothing to keep

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        """The frame's one record (:meth:`frame`)."""
        _size, channel, frame_type, length, flags = self.frame(item)
        key = "" if channel is None else str(channel)
        return [self.rec(direction, time_ns, offset, key, frame_type, length, flags)]
