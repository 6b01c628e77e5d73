"""omnistreams (the spec's numbering) and omnistreams-legacy (npm omnistreams 0.9's): the
formats' definitions, their frame-record walk and their signatures.

The codec is :mod:`polymux.wire.omnistreams` (over byte streams, each message has a
4-byte length prefix), the engine :class:`polymux.engine.omnistreams.OmnistreamsEngine`
(with its capabilities). The numbering is the format: ``protocol="omnistreams"`` with the
compatibility keyword ``omnistreams_numbering="legacy"`` resolves to
``omnistreams-legacy``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from polymux.config import SessionConfig
from polymux.engine.base import Engine
from polymux.engine.omnistreams import CAPABILITIES, OmnistreamsEngine, decode_metadata
from polymux.formats.format import EngineFactory, Format, FormatDocs
from polymux.formats.records import FrameRecord
from polymux.formats.signature import Fit, Probe, Signature, frame_confidence, frames, starts
from polymux.formats.walk import (
    OTHER,
    PREFIX,
    Codec,
    Credit,
    FastHeader,
    Generations,
    Violation,
    Walk,
    WalkHost,
    new_record,
)
from polymux.wire import omnistreams as wire


__all__ = ["FORMATS", "OMNISTREAMS", "OMNISTREAMS_LEGACY", "OmnistreamsWalk"]


class _OmniCodec:
    """One direction of omnistreams over a byte stream: length-prefixed messages."""

    def __init__(self, walk: OmnistreamsWalk) -> None:
        self.walk = walk
        self.split = walk.wire.LengthPrefixDecoder()

    @property
    def pending(self) -> int:
        return int(self.split.pending)

    def feed(self, data: bytes) -> list[Any]:
        decode = self.walk.wire.decode
        numbering = self.walk.numbering
        return [decode(message, numbering) for message in self.split.feed(data)]


class OmnistreamsWalk(Walk):
    """omnistreams (4-byte length prefixes on byte streams): a stream is one-way, from its
    creator; ids are per sender and reused; the receiver grants message credits with
    STREAM_REQUEST_DATA (one count byte), and each STREAM_DATA message costs one."""

    def __init__(self, decoder: WalkHost, numbering: str) -> None:
        super().__init__(decoder)
        self.wire = wire
        self.numbering = wire.NUMBERINGS[numbering]
        self.names = Generations()
        self.credit: dict[str, Credit] = {}

    def codec(self, direction: str) -> Codec:
        return _OmniCodec(self)

    def size(self, item: Any) -> int:
        return 4 + 1 + (0 if item.stream_id is None else 1) + len(item.payload)

    MAX_HEAD = 6  # length prefix, type byte, stream id

    def fast_header(self, direction: str, buf: Any, pos: int, end: int) -> FastHeader | bool | None:
        wire = self.wire
        if end - pos < 4:
            return None
        size = buf[pos] << 24 | buf[pos + 1] << 16 | buf[pos + 2] << 8 | buf[pos + 3]
        if size == 0 or size > wire.MAX_MESSAGE_SIZE:
            return False  # the codec refuses the prefix at once
        if end - pos < 5:
            return None
        kind = self.numbering.by_code.get(buf[pos + 4])
        if kind is None:
            return False
        K = wire.Kind
        if kind is K.CONTROL:
            return 5, size - 1, False, (kind, None)
        if size < 2:
            return False
        if end - pos < 6:
            return None
        n = size - 2
        if (kind is K.REQUEST_DATA and n != 1) or (n and kind in (K.END, K.CANCEL_RECEIVE, K.CANCEL_SEND)):
            return False
        return 6, n, kind is K.DATA, (kind, buf[pos + 5])

    def fast_item(self, fields: tuple[Any, ...], payload: Any) -> Any:
        return self.wire.Message(fields[0], fields[1], payload)

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
        if not data:
            return None
        key = f"{PREFIX[direction]}{fields[1]}"
        channel = self.names.current.get(key, key)
        credit = self.credit.get(channel)
        if credit is None or credit.left < 1 or self.decoder.one_way:
            return None
        credit.in_flight += 1
        return new_record(
            FrameRecord,
            (
                self.decoder.session, direction, time_ns, self.fmt, offset, channel, "data", length,
                self.numbering.codes[fields[0]], credit.left, direction, None, None,
                self.channel_names.get(channel),
            ),
        )  # fmt: skip

    def payload(self, item: Any) -> Any:
        return item.payload

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        kind = item.kind
        K = self.wire.Kind
        flags = self.numbering.codes[kind]
        n = len(item.payload)
        rec = self.rec
        if kind is K.CONTROL:
            return [rec(direction, time_ns, offset, "", "control", n, flags)]
        sid = item.stream_id
        if kind is K.REQUEST_DATA and n == 1 and item.payload[0] == 0:
            return [rec(direction, time_ns, offset, "", "heartbeat", 0, flags)]  # a request for nothing
        # Data flows from the stream's creator: it sends CREATE, DATA, END and
        # CANCEL_RECEIVE; the receiver sends REQUEST_DATA and CANCEL_SEND.
        receiver_side = kind in (K.REQUEST_DATA, K.CANCEL_SEND)
        sender = OTHER[direction] if receiver_side else direction
        key = f"{PREFIX[sender]}{sid}"
        if kind is K.CREATE:
            channel = self.names.new(key)
            self.credit[channel] = Credit(0)
            meta = decode_metadata(item.payload)
            if meta is not None and "name" in meta:
                value = meta["name"]
                self.channel_names[channel] = value if isinstance(value, str) else str(value)
            return [rec(direction, time_ns, offset, channel, "open", n, flags)]
        channel = self.names.get(key)
        credit = self.credit.setdefault(channel, Credit(0))
        if kind is K.DATA:
            credit.in_flight += 1
            if credit.left < 0 and not self.decoder.one_way:
                raise Violation(
                    f"{self.fmt}: stream {channel}: STREAM_DATA beyond the requested message credit"
                )
            return [rec(direction, time_ns, offset, channel, "data", n, flags, credit.left, sender)]
        if kind is K.REQUEST_DATA:
            count = item.payload[0]
            credit.window += count
            return [
                rec(direction, time_ns, offset, channel, "window_update", count, flags, credit.left, sender)
            ]
        if kind is K.END:
            return [rec(direction, time_ns, offset, channel, "end", n, flags)]
        return [rec(direction, time_ns, offset, channel, "reset", n, flags)]  # either cancel


# -- the signatures --------------------------------------------------------------------------


def _fits(probe: Probe, fmt: Format, create: int) -> list[Fit]:
    """4-byte length prefixes, the first message a CREATE_RECEIVE_STREAM (type ``create``
    in ``fmt``'s numbering) or CONTROL."""
    c2s = probe.c2s
    if not all(len(h) < 2 or h[:2] == b"\x00\x00" for h in (c2s, probe.s2c) if h):
        return []
    records = probe.decode(fmt)
    if records is not None and starts(records, probe.heads, ("open", "control", "window_update")):
        n = frames(records)
        return [
            Fit(
                fmt.name,
                frame_confidence(n),
                f"{n} {fmt.name} frame{'s' * (n != 1)}, length-prefixed messages, the first a "
                "CREATE_RECEIVE_STREAM or CONTROL",
            )
        ]
    # A first message longer than the head (creation metadata): its length prefix and
    # type byte, with the stream id 0 the first stream gets.
    if len(c2s) >= 6 and 0 < int.from_bytes(c2s[:4], "big") <= 1 << 24 and c2s[4:6] == bytes((create, 0)):
        return [
            Fit(
                fmt.name,
                0.5,
                "a length prefix and a CREATE_RECEIVE_STREAM for stream 0 (longer than the head)",
            )
        ]
    return []


# -- the formats -----------------------------------------------------------------------------


def _engine(numbering: str) -> EngineFactory:
    def make(fmt: Format, config: SessionConfig, is_client: bool, message_mode: bool) -> Engine:
        return OmnistreamsEngine(config, numbering=numbering, message_mode=message_mode)

    return make


def _numbering(fmt: Format, config: SessionConfig) -> Format:
    """``omnistreams_numbering="legacy"`` (a compatibility keyword) makes ``omnistreams``
    the ``omnistreams-legacy`` format."""
    numbering = config.omnistreams_numbering
    if numbering is not None and numbering not in wire.NUMBERINGS:
        raise ValueError(f"SessionConfig.omnistreams_numbering must be 'spec' or 'legacy', got {numbering!r}")
    return OMNISTREAMS_LEGACY if fmt.name == "omnistreams" and numbering == "legacy" else fmt


OMNISTREAMS: Format = Format(
    "omnistreams",
    "omnistreams (the spec's numbering)",
    "omnistreams",
    CAPABILITIES,
    _engine("spec"),
    partial(OmnistreamsWalk, numbering="spec"),
    Signature(lambda probe: _fits(probe, OMNISTREAMS, 1), rank=30),
    docs=FormatDocs(
        page="formats/omnistreams.md",
        tested_against="the specification (npm `omnistreams` uses the legacy numbering); polymux's "
        "`omnistreams.js` speaks both",
        credit="a credit of messages per stream",
        names="in the creation metadata",
        half_close="streams are one-way (`open_pair` gives two)",
        limits="256 streams at once per direction (one-byte ids); messages up to 1 MiB + 2 (`max_message_size`)",
    ),
    legacy=_numbering,
    versions=("omnistreams-legacy",),
)
"""omnistreams, numbered as its specification says."""

OMNISTREAMS_LEGACY: Format = Format(
    "omnistreams-legacy",
    "omnistreams (npm omnistreams 0.9 numbering)",
    "omnistreams-legacy",
    CAPABILITIES,
    _engine("legacy"),
    partial(OmnistreamsWalk, numbering="legacy"),
    Signature(lambda probe: _fits(probe, OMNISTREAMS_LEGACY, 0), rank=30),
    docs=FormatDocs(
        page="formats/omnistreams.md",
        tested_against="npm `omnistreams` 0.9.0 over npm `ws`, both roles, WebSocket",
        credit="as omnistreams",
        names="in the creation metadata",
        half_close="as omnistreams",
        limits="as omnistreams; a sender's cancel goes out as END",
    ),
    legacy=_numbering,
    versions=("omnistreams",),
)
"""omnistreams as npm ``omnistreams`` 0.9.0 and its Go and Rust ports number it."""

FORMATS = (OMNISTREAMS, OMNISTREAMS_LEGACY)
"""Both numberings, in the registry's order."""
