"""MultiplexingStream (Nerdbank.Streams) v1, v2 and v3: the formats' definitions, their
frame-record walk and their signatures.

The codec is :mod:`polymux.wire.mstream`, the engine
:class:`polymux.engine.mstream.MStreamEngine` (with its capabilities per version).
"""

from __future__ import annotations

import struct
from functools import partial
from typing import Any

from polymux.config import SessionConfig
from polymux.engine.base import Engine
from polymux.engine.mstream import CAPABILITIES, DEFAULT_REMOTE_WINDOW, HEARTBEAT_CODE, MStreamEngine
from polymux.exceptions import ProtocolError
from polymux.formats.format import EngineFactory, Format, FormatDocs
from polymux.formats.records import FrameRecord
from polymux.formats.signature import Fit, Probe, Signature, frame_confidence, frames, sides, starts
from polymux.formats.walk import (
    OTHER,
    PREFIX,
    Codec,
    Credit,
    FastHeader,
    Violation,
    Walk,
    WalkHost,
    new_record,
)
from polymux.wire import mstream as wire


__all__ = ["FORMATS", "MSTREAM_V1", "MSTREAM_V2", "MSTREAM_V3", "MStreamWalk"]


_MSTREAM_TYPES = {
    0: "open",
    1: "open_ack",
    2: "data",
    3: "end",
    5: "window_update",
    6: "stop_reading",
    7: "window_update",
    8: "window_request",
}


class MStreamWalk(Walk):
    """MultiplexingStream v1/v2/v3 (Nerdbank.Streams). v2/v3: each side's receive window
    comes with its Offer or OfferAccepted (102,400 bytes when absent), ContentProcessed
    returns credit as a delta, ChannelWindowAdjust sets a larger absolute window. The
    opener may not send before the OfferAccepted. v1 has no flow control."""

    def __init__(self, decoder: WalkHost, version: int) -> None:
        super().__init__(decoder)
        self.wire = wire
        self.version = version
        self.handshaken: set[str] = set()
        self.credit: dict[tuple[str, str], Credit] = {}
        self.default_window = DEFAULT_REMOTE_WINDOW
        self.max_payload = wire.MAX_PAYLOAD
        self._v1 = struct.Struct(">BiH")  # the v1 header: code, channel id, payload length
        self._sources = {0x01: 1, 0x00: 0, 0xFF: -1}  # v3 source fixints

    def codec(self, direction: str) -> Codec:
        return self.wire.Decoder(self.version, handshake=direction not in self.handshaken)

    MAX_HEAD = 3 + 9 + 9 + 9 + 5  # the longest v2/v3 header (any integer width, bin32)

    def fast_header(self, direction: str, buf: Any, pos: int, end: int) -> FastHeader | bool | None:
        version = self.version
        if version != 3 and direction not in self.handshaken:
            return False  # the handshake: the codec's
        avail = end - pos
        if version == 1:
            if avail < 7:
                return None
            code, cid, length = self._v1.unpack_from(buf, pos)
            if length > self.max_payload or cid < 0:
                return False
            return 7, length, code == 2, (code, cid, None)
        # v2/v3: msgpack arrays of positive fixints ([code], [code, id(, source)]), ids up
        # to uint16, and a bin8/bin16 payload; other encodings are legal but the codec's.
        # None only while every byte seen fits such a header: the codec may reject the
        # frame from its first bytes, and must then do so at the same chunk.
        if not avail:
            return None
        first = buf[pos]
        v3 = version == 3
        full = 0x94 if v3 else 0x93
        if first != full and first != full - 1 and first != 0x91:
            return False
        if avail < 2:
            return None
        code = buf[pos + 1]
        if code >= 0x80:
            return False
        if first == 0x91:
            return 2, 0, False, (code, None, None)
        at = pos + 2
        if at >= end:
            return None
        cid = buf[at]
        at += 1
        if cid >= 0x80 and cid != 0xCC and cid != 0xCD:
            return False
        if cid >= 0x80:
            if cid == 0xCC:
                if at + 1 > end:
                    return None
                cid = buf[at]
                at += 1
            elif cid == 0xCD:
                if at + 2 > end:
                    return None
                cid = buf[at] << 8 | buf[at + 1]
                at += 2
            else:
                return False
        source = None
        if v3:
            if at >= end:
                return None
            source = self._sources.get(buf[at])
            if source is None:
                return False
            at += 1
        if first != full:
            return at - pos, 0, False, (code, cid, source)
        if at + 1 > end:
            return None
        kind = buf[at]
        if kind != 0xC4 and kind != 0xC5:
            return False
        if kind == 0xC4:
            if at + 2 > end:
                return None
            length = buf[at + 1]
            at += 2
        elif kind == 0xC5:
            if at + 3 > end:
                return None
            length = buf[at + 1] << 8 | buf[at + 2]
            at += 3
        else:
            return False
        if length > self.max_payload:
            return False
        return at - pos, length, code == 2, (code, cid, source)

    def fast_item(self, fields: tuple[Any, ...], payload: Any) -> Any:
        code, cid, source = fields
        return self.wire.Frame(code, cid, payload, source)

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
        # v3 frames of the shape every peer sends in bulk: [code, id, source, bin8/16] with
        # fixints, Content (code 2) and ContentProcessed (code 5) of a channel we track
        if self.version != 3 or self.decoder.one_way:
            return pos
        credits = self.credit
        other = OTHER[direction]
        session = self.decoder.session
        fmt = self.fmt
        names = self.channel_names
        append = out.append
        base = offset - pos
        opener = {1: PREFIX[direction], -1: PREFIX[other]}
        sources = self._sources
        while end - pos >= 6 and buf[pos] == 0x94:
            code = buf[pos + 1]
            cid = buf[pos + 2]
            source = sources.get(buf[pos + 3])
            kind = buf[pos + 4]
            if cid >= 0x80 or not source or (code != 2 and code != 5):
                break
            if kind == 0xC5:
                length = buf[pos + 5] << 8 | buf[pos + 6] if end - pos >= 7 else -1
                at = pos + 7
            elif kind == 0xC4:
                length = buf[pos + 5]
                at = pos + 6
            else:
                break
            stop = at + length
            if length < 0 or stop > end or length > self.max_payload:
                break
            channel = f"{opener[source]}{cid}"
            if code == 2:
                credit = credits.get((channel, direction))
                if credit is None or credit.left < length:
                    break
                credit.in_flight += length
                record = new_record(
                    FrameRecord,
                    (
                        session, direction, time_ns, fmt, base + pos, channel, "data", length, 2,
                        credit.left, direction, None, None, names.get(channel),
                    ),
                )  # fmt: skip
                kept = bytes(buf[at : at + min(prefix, length)]) if payloads is not None else b""
            else:
                kept = bytes(buf[at:stop])
                record = self._fast_processed(direction, channel, kept, base + pos, time_ns)  # type: ignore[assignment]
                if record is None:
                    break
                kept = kept[:prefix]
            append(record)
            if payloads is not None:
                payloads.append(kept)
            pos = stop
        return pos

    def _fast_processed(
        self, direction: str, channel: str, payload: bytes, offset: int, time_ns: int
    ) -> FrameRecord | None:
        """A ContentProcessed whose payload is msgpack ``[uint]`` in its shortest form."""
        n = len(payload)
        if self.version < 2 or self.decoder.one_way or n < 2 or payload[0] != 0x91:
            return None
        b = payload[1]
        if b < 0x80 and n == 2:
            processed = b
        elif b == 0xCD and n == 4:
            processed = payload[2] << 8 | payload[3]
        elif b == 0xCE and n == 6:
            processed = int.from_bytes(payload[2:6], "big")
        else:
            return None
        other = OTHER[direction]
        grant = self.credit.get((channel, other))
        if grant is None or processed > grant.in_flight:
            return None
        grant.in_flight -= processed
        return new_record(
            FrameRecord,
            (
                self.decoder.session, direction, time_ns, self.fmt, offset, channel, "window_update",
                processed, 5, grant.left, other, None, None, self.channel_names.get(channel),
            ),
        )  # fmt: skip

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
        code, cid, source = fields
        if not (data and length) and code != 5:
            return None
        if self.version != 3:
            channel = str(cid)
        elif source == 0:
            channel = f"seed{cid}"
        else:
            channel = f"{PREFIX[direction if source == 1 else OTHER[direction]]}{cid}"
        if code == 5:  # ContentProcessed: credit given back to the other direction
            return self._fast_processed(direction, channel, kept, offset, time_ns)
        left: int | None = None
        credit_dir = ""
        if self.version >= 2 and not self.decoder.one_way:
            credit = self.credit.get((channel, direction))
            if credit is None or credit.left < length:
                return None
            credit.in_flight += length
            left = credit.left
            credit_dir = direction
        elif self.version >= 2:
            return None
        return new_record(
            FrameRecord,
            (
                self.decoder.session, direction, time_ns, self.fmt, offset, channel, "data", length, 2,
                left, credit_dir, None, None, self.channel_names.get(channel),
            ),
        )  # fmt: skip

    def payload(self, item: Any) -> Any:
        return b"" if isinstance(item, self.wire.Handshake) else item.payload

    def size(self, item: Any) -> int:
        wire = self.wire
        if isinstance(item, wire.Handshake):
            return 20 if self.version == 1 else 22
        n = len(item.payload)
        if self.version == 1:
            return 7 + n
        return len(wire.encode_header(self.version, item.code, item.channel_id, n, item.source)) + n

    def _channel(self, direction: str, item: Any) -> str:
        cid = item.channel_id
        if cid is None:
            return ""
        if self.version != 3:
            return str(cid)
        source = item.source
        if source == 0:
            return f"seed{cid}"
        opener = direction if source == 1 else OTHER[direction]
        return f"{PREFIX[opener]}{cid}"

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        wire = self.wire
        if isinstance(item, wire.Handshake):
            self.handshaken.add(direction)
            major = item.version[0]
            if major != self.version:
                raise Violation(
                    f"{self.fmt}: handshake field version is {major}.{item.version[1]}, expected {self.version}.x"
                )
            return [self.rec(direction, time_ns, offset, "", "handshake", 0, major)]
        code = item.code
        if code == HEARTBEAT_CODE:
            return [self.rec(direction, time_ns, offset, "", "heartbeat", 0, code)]
        channel = self._channel(direction, item)
        payload = item.payload
        n = len(payload)
        other = OTHER[direction]
        rec = self.rec
        flow = self.version >= 2
        if code == 2:  # Content
            if not flow:
                return [rec(direction, time_ns, offset, channel, "data", n, code)]
            credit = self.credit.get((channel, direction))
            if credit is None:  # no window granted to this direction yet (not accepted)
                credit = self.credit[(channel, direction)] = Credit(0)
            credit.in_flight += n
            if credit.left < 0 and not self.decoder.one_way:
                raise Violation(
                    f"{self.fmt}: channel {channel}: Content of {n} bytes overran the send window "
                    f"({credit.left + n} bytes left)"
                )
            return [rec(direction, time_ns, offset, channel, "data", n, code, credit.left, direction)]
        try:
            if code == 0:  # Offer: the opener's receive window is the other side's credit
                name, window = wire.decode_offer(self.version, payload)
                self.channel_names[channel] = name
                if not flow:
                    return [rec(direction, time_ns, offset, channel, "open", n, code)]
                grant = self.credit[(channel, other)] = Credit(
                    self.default_window if window is None else window
                )
                return [rec(direction, time_ns, offset, channel, "open", n, code, grant.left, other)]
            if code == 1:  # OfferAccepted: the acceptor's window is the opener's credit
                window = wire.decode_offer_accepted(self.version, payload)
                if not flow:
                    return [rec(direction, time_ns, offset, channel, "open_ack", n, code)]
                grant = self.credit.setdefault((channel, other), Credit(0))
                grant.window = self.default_window if window is None else window
                return [rec(direction, time_ns, offset, channel, "open_ack", n, code, grant.left, other)]
            if code == 4:  # ChannelTerminated
                message = wire.decode_termination(self.version, payload)
                kind = "close" if message is None else "reset"
                return [rec(direction, time_ns, offset, channel, kind, n, code, error=message)]
            if code == 5 and flow:  # ContentProcessed: a delta for the other direction
                processed = wire.decode_content_processed(self.version, payload)
                grant = self.credit.setdefault((channel, other), Credit(0))
                if processed > grant.in_flight and not self.decoder.one_way:
                    raise Violation(
                        f"{self.fmt}: channel {channel}: ContentProcessed acknowledges {processed} bytes, "
                        f"but only {grant.in_flight} are in flight"
                    )
                grant.in_flight -= processed
                return [
                    rec(
                        direction,
                        time_ns,
                        offset,
                        channel,
                        "window_update",
                        processed,
                        code,
                        grant.left,
                        other,
                    )
                ]
            if code == 7 and flow:  # ChannelWindowAdjust: a new absolute window (only grows)
                window = wire.decode_window_adjust(self.version, payload)
                grant = self.credit.setdefault((channel, other), Credit(0))
                growth = max(0, window - grant.window)
                grant.window += growth
                return [
                    rec(direction, time_ns, offset, channel, "window_update", growth, code, grant.left, other)
                ]
        except ProtocolError as exc:
            raise Violation(str(exc)) from None
        return [rec(direction, time_ns, offset, channel, _MSTREAM_TYPES.get(code, "unknown"), n, code)]

    def truncated_detail(self, direction: str) -> str:
        return "frame" if direction in self.handshaken or self.version == 3 else "handshake"


# -- the signatures --------------------------------------------------------------------------

_V1_MAGIC = bytes.fromhex("2fdf1d50")


def _v1_fits(probe: Probe) -> list[Fit]:
    """The v1 handshake starts with the magic ``2f df 1d 50``."""
    present = {d: h for d, h in probe.heads.items() if h}
    hs = list(present.values())
    if all(h[:4] == _V1_MAGIC[: len(h[:4])] for h in hs) and any(len(h) >= 4 for h in hs):
        return [Fit("mstream-v1", 0.99, f"the MultiplexingStream v1 magic 2f df 1d 50 ({sides(present)})")]
    return []


def _v2_fits(probe: Probe) -> list[Fit]:
    """The v2 handshake is msgpack ``[[2, minor], bin(16)]``: ``92 92 02``."""
    present = {d: h for d, h in probe.heads.items() if h}
    hs = list(present.values())
    if all(h[:3] == b"\x92\x92\x02"[: len(h[:3])] for h in hs) and any(len(h) >= 3 for h in hs):
        full = all(len(h) >= 6 and h[4:6] == b"\xc4\x10" for h in hs)
        return [
            Fit(
                "mstream-v2",
                0.99 if full else 0.9,
                f"the MultiplexingStream v2 handshake [[2, minor], bin(16)] ({sides(present)})",
            )
        ]
    return []


def _v3_fits(probe: Probe) -> list[Fit]:
    """msgpack array frames, the first an Offer (code 0)."""
    if not all(h[0] in (0x93, 0x94) for h in (probe.c2s, probe.s2c) if h):
        return []
    records = probe.decode(MSTREAM_V3)
    if records is None or not starts(records, probe.heads, ("open", "open_ack", "data")):
        return []
    n = frames(records)
    return [
        Fit(
            "mstream-v3",
            frame_confidence(n),
            f"{n} mstream-v3 frame{'s' * (n != 1)}, msgpack arrays, the first an Offer",
        )
    ]


# -- the formats -----------------------------------------------------------------------------


def _engine(version: int) -> EngineFactory:
    def make(fmt: Format, config: SessionConfig, is_client: bool, message_mode: bool) -> Engine:
        return MStreamEngine(version, config)

    return make


_TESTED = "npm `nerdbank-streams` 2.13.16, both roles, TCP and unix"
_FRAME = "payload at most 20 KiB per frame"

MSTREAM_V1: Format = Format(
    "mstream-v1",
    "Nerdbank MultiplexingStream v1",
    "mstream-v1",
    CAPABILITIES[1],
    _engine(1),
    partial(MStreamWalk, version=1),
    Signature(_v1_fits, handshake=True, rank=10),
    docs=FormatDocs(
        page="formats/mstream.md",
        tested_against=_TESTED,
        credit="a full channel pauses the whole connection, as the reference does",
        names="offers are named",
        limits=f"{_FRAME}; starts with a handshake",
    ),
    versions=("mstream-v2", "mstream-v3"),
)
"""MultiplexingStream v1: no flow control."""

MSTREAM_V2: Format = Format(
    "mstream-v2",
    "Nerdbank MultiplexingStream v2",
    "mstream-v2",
    CAPABILITIES[2],
    _engine(2),
    partial(MStreamWalk, version=2),
    Signature(_v2_fits, handshake=True, rank=20),
    docs=FormatDocs(
        page="formats/mstream.md",
        tested_against=_TESTED,
        credit="a window per channel, announced in the offer and its acceptance",
        names="offers are named",
        limits=f"{_FRAME}; starts with a handshake",
    ),
    versions=("mstream-v1", "mstream-v3"),
)
"""MultiplexingStream v2: a byte window per channel."""

MSTREAM_V3: Format = Format(
    "mstream-v3",
    "Nerdbank MultiplexingStream v3",
    "mstream-v3",
    CAPABILITIES[3],
    _engine(3),
    partial(MStreamWalk, version=3),
    Signature(_v3_fits, rank=20),
    docs=FormatDocs(
        page="formats/mstream.md",
        tested_against=_TESTED,
        credit="as v2",
        names="offers are named",
        limits=f"{_FRAME}; seeded channels are not supported",
    ),
    versions=("mstream-v1", "mstream-v2"),
)
"""MultiplexingStream v3: v2 without the handshake, channel ids scoped by their source."""

FORMATS = (MSTREAM_V1, MSTREAM_V2, MSTREAM_V3)
"""The three major versions, in the registry's order."""
