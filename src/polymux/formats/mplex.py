"""mplex (libp2p) and multiplex (npm): one wire, two dialects. The formats' definitions,
their frame-record walk and their family's signature.

The codec is :mod:`polymux.wire.mplex`, the engine :class:`polymux.engine.mplex.MplexEngine`
(with its capabilities per dialect).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from polymux.config import SessionConfig
from polymux.engine.base import Engine
from polymux.engine.mplex import CAPABILITIES, HEARTBEAT_STREAM, MAX_MESSAGE_SIZES, MplexEngine
from polymux.exceptions import ProtocolError
from polymux.formats.format import Format, FormatDocs
from polymux.formats.records import FrameRecord
from polymux.formats.signature import Fit, Probe, Signature, first, frame_confidence, frames, starts
from polymux.formats.walk import OTHER, PREFIX, Codec, FastHeader, Generations, Walk, WalkHost, new_record
from polymux.wire import mplex as wire
from polymux.wire._varint import Incomplete, read_uvarint, uvarint_size


__all__ = ["FORMATS", "MPLEX", "MULTIPLEX", "MplexWalk"]

_MPLEX_TYPES = ("open", "data", "data", "end", "end", "reset", "reset")


class MplexWalk(Walk):
    """mplex / multiplex: each side numbers the streams it opens; a frame's flag says
    whether its sender is the stream's initiator (even flags) or receiver (odd). No flow
    control on the wire."""

    def __init__(self, decoder: WalkHost, max_size: int, id_names: bool = False) -> None:
        super().__init__(decoder)
        self.wire = wire
        self.max_size = max_size
        self.id_names = id_names
        """A NewStream with an empty body names the stream by its id (multiplex's
        convention)."""
        self.names = Generations()

    def codec(self, direction: str) -> Codec:
        return self.wire.Decoder(self.max_size, self.fmt)

    def size(self, item: Any) -> int:
        n = len(item.body)
        return uvarint_size(item.stream_id << 3 | item.flag) + uvarint_size(n) + n

    MAX_HEAD = 18  # two 9-byte varints

    def fast_header(self, direction: str, buf: Any, pos: int, end: int) -> FastHeader | bool | None:
        # In the codec's order (a bad flag is rejected before the length is read).
        try:
            head, at = read_uvarint(buf, pos, end, 9)
            flag = head & 7
            if flag == 7:
                return False
            length, at = read_uvarint(buf, at, end, 9)
        except Incomplete as incomplete:
            incomplete.__traceback__ = None  # a shared instance: keep no frames alive
            return None
        except ValueError:
            return False
        if length > self.max_size:
            return False
        return at - pos, length, flag == 1 or flag == 2, (head >> 3, flag)

    def fast_item(self, fields: tuple[Any, ...], payload: Any) -> Any:
        return self.wire.Frame(fields[0], fields[1], payload)

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
        # Message frames with a one-byte header (ids < 16) and a length of 1-3 bytes
        session = self.decoder.session
        fmt = self.fmt
        current = self.names.current
        names = self.channel_names
        append = out.append
        base = offset - pos
        limit = self.max_size
        other = OTHER[direction]
        while end - pos >= 3:
            h = buf[pos]
            flag = h & 7
            if h >= 0x80 or (flag != 1 and flag != 2):
                break
            b1 = buf[pos + 1]
            if b1 < 0x80:
                length = b1
                at = pos + 2
            elif buf[pos + 2] < 0x80:
                length = (b1 & 0x7F) | buf[pos + 2] << 7
                at = pos + 3
            elif end - pos >= 4 and buf[pos + 3] < 0x80:
                length = (b1 & 0x7F) | (buf[pos + 2] & 0x7F) << 7 | buf[pos + 3] << 14
                at = pos + 4
            else:
                break
            stop = at + length
            if stop > end or length > limit or not length:
                break
            key = f"{PREFIX[direction if flag == 2 else other]}{h >> 3}"
            channel = current.get(key, key)
            record = new_record(
                FrameRecord,
                (
                    session,
                    direction,
                    time_ns,
                    fmt,
                    base + pos,
                    channel,
                    "data",
                    length,
                    flag,
                    None,
                    "",
                    None,
                    None,
                    names.get(channel),
                ),
            )  # fmt: skip
            append(record)
            if payloads is not None:
                payloads.append(bytes(buf[at : at + min(prefix, length)]))
            pos = stop
        return pos

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
        sid, flag = fields
        opener = direction if flag % 2 == 0 else OTHER[direction]
        key = f"{PREFIX[opener]}{sid}"
        channel = self.names.current.get(key, key)
        return new_record(
            FrameRecord,
            (
                self.decoder.session, direction, time_ns, self.fmt, offset, channel, "data", length, flag,
                None, "", None, None, self.channel_names.get(channel),
            ),
        )  # fmt: skip

    def payload(self, item: Any) -> Any:
        return item.body

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        flag = item.flag
        if flag == wire.Flag.RESET_INITIATOR and item.stream_id == HEARTBEAT_STREAM:
            return [self.rec(direction, time_ns, offset, "", "heartbeat", 0, flag)]
        opener = direction if flag % 2 == 0 else OTHER[direction]
        key = f"{PREFIX[opener]}{item.stream_id}"
        body = item.body
        if flag == 0:
            channel = self.names.new(key)
            # multiplex names a stream by its id when the NewStream body is empty
            name = bytes(body).decode("utf-8", "replace")
            self.channel_names[channel] = name or (str(item.stream_id) if self.id_names else "")
        else:
            channel = self.names.get(key)
        error = None
        if flag >= 5 and body:
            error = bytes(body).decode("utf-8", "replace")
        return [
            self.rec(direction, time_ns, offset, channel, _MPLEX_TYPES[flag], len(body), flag, error=error)
        ]


# -- the signature (one for the family) ------------------------------------------------------


def _small_ids(records: list[FrameRecord]) -> bool:
    """The first channel each side names has a small id (a fresh connection's)."""
    for direction in ("c2s", "s2c"):
        found = first(records, direction)
        if found is not None and found.channel:
            digits = found.channel.lstrip("cs").split("#")[0]
            if not digits.isdigit() or int(digits) >= 1024:
                return False
    return True


def _fits(probe: Probe) -> list[Fit]:
    """mplex and multiplex (one wire): varint frames, the first a NewStream with a small
    id; both fit, and the evidence decides their order. NewStream names ``i0``, ``i1`` ...
    (@libp2p/mplex) or equal to the stream id (multiplex sends an empty name then) say
    ``mplex``; a frame over mplex's 1 MiB or a reset carrying a message says
    ``multiplex``. Without such evidence both fit as well: the detection is ambiguous."""
    heads = probe.heads
    strict = probe.decode(MPLEX)
    records = strict if strict is not None else probe.decode(MULTIPLEX)
    if records is None or not starts(records, heads, ("open",), ("data", "end", "reset")):
        return []
    decoded = _decoded(heads)
    if not _small_ids(records) or _reopens(decoded):
        return []
    n = frames(records)
    conf = frame_confidence(n)
    base = f"{n} mplex/multiplex frame{'s' * (n != 1)}, the first a NewStream"
    if strict is None:
        return [Fit("multiplex", conf, f"{base}; a frame longer than mplex's 1 MiB")]
    says_mplex, says_multiplex = _dialect(decoded)
    if says_mplex and not says_multiplex:
        return [
            Fit("mplex", conf, f"{base}; {says_mplex}"),
            Fit("multiplex", conf / 2, "the same wire as mplex"),
        ]
    if says_multiplex and not says_mplex:
        return [
            Fit("multiplex", conf, f"{base}; {says_multiplex}"),
            Fit("mplex", conf / 2, "the same wire as multiplex"),
        ]
    why = "nothing in the first bytes tells the two apart"
    if says_mplex and says_multiplex:
        why = f"contradicting hints ({says_mplex}; {says_multiplex})"
    return [
        Fit("mplex", conf, f"{base}; {why}"),
        Fit("multiplex", conf, f"{base}; {why}"),
    ]


def _decoded(heads: dict[str, bytes]) -> list[list[wire.Frame]]:
    """Each direction's first bytes as wire frames, decoded once for :func:`_reopens` and
    :func:`_dialect` (a direction that breaks the wire gives none)."""
    out = []
    for head in heads.values():
        if not head:
            continue
        try:
            out.append(wire.Decoder(MAX_MESSAGE_SIZES["multiplex"], "multiplex").feed(head))
        except ProtocolError:
            continue
    return out


def _reopens(decoded: list[list[wire.Frame]]) -> bool:
    """A NewStream for an id its sender already has open: what no mplex or multiplex peer
    sends (their sessions end on it), and what other formats' bytes read as mplex often
    look like (a yamux ping is four NewStreams of stream 0)."""
    for frames_ in decoded:
        opened: set[int] = set()
        for f in frames_:
            if f.flag == 0:
                if f.stream_id in opened:
                    return True
                opened.add(f.stream_id)
            elif f.flag in (4, 6):  # the initiator closes or resets its own stream
                opened.discard(f.stream_id)
    return False


def _dialect(decoded: list[list[wire.Frame]]) -> tuple[str, str]:
    """Hints in the frames themselves: (what says mplex, what says multiplex), "" for none."""
    names: list[tuple[int, bytes]] = []
    reset_texts = 0
    for frames_ in decoded:
        for f in frames_:
            body = bytes(f.body)
            if f.flag == 0:
                names.append((f.stream_id, body))
            elif f.flag >= 5 and body:
                reset_texts += 1
    says_mplex = ""
    if names and all(body == b"i%d" % sid for sid, body in names):
        says_mplex = f"NewStream names {', '.join(b.decode() for _s, b in names[:3])} (@libp2p/mplex's i<id>)"
    elif names and all(body == b"%d" % sid for sid, body in names):
        says_mplex = "NewStream names that equal the stream id (multiplex sends none then)"
    says_multiplex = f"a reset carrying a message ({reset_texts})" if reset_texts else ""
    return says_mplex, says_multiplex


# -- the formats -----------------------------------------------------------------------------


def _mplex_engine(fmt: Format, config: SessionConfig, is_client: bool, message_mode: bool) -> Engine:
    return MplexEngine("mplex", config)


def _multiplex_engine(fmt: Format, config: SessionConfig, is_client: bool, message_mode: bool) -> Engine:
    return MplexEngine("multiplex", config)


MPLEX: Format = Format(
    "mplex",
    "mplex (libp2p)",
    "mplex",
    CAPABILITIES["mplex"],
    _mplex_engine,
    partial(MplexWalk, max_size=MAX_MESSAGE_SIZES["mplex"]),
    Signature(_fits, rank=40),
    docs=FormatDocs(
        page="formats/mplex.md",
        tested_against="npm `@libp2p/mplex`",
        credit="a bounded buffer per channel and the slow-reader policy",
        names="sent on open (libp2p peers name their own streams and ignore the name)",
        limits="frames up to 1 MiB (`max_message_size`); no acceptance step: a refused stream is reset",
    ),
)
"""libp2p's mplex: resets carry no text."""

MULTIPLEX: Format = Format(
    "multiplex",
    "multiplex (npm)",
    "mplex",
    CAPABILITIES["multiplex"],
    _multiplex_engine,
    partial(MplexWalk, max_size=MAX_MESSAGE_SIZES["multiplex"], id_names=True),
    None,  # mplex's signature names it too
    docs=FormatDocs(
        page="formats/mplex.md",
        tested_against="npm `multiplex`",
        credit="as mplex",
        names="sent on open",
        limits="frames up to 16 MiB (`max_message_size`)",
    ),
)
"""maxogden's multiplex: mplex's wire; resets carry the error text, and a stream opened
without a name is named by its id."""

FORMATS = (MPLEX, MULTIPLEX)
"""Both dialects, in the registry's order."""
