"""Guess a connection's wire format from the first bytes each side sent.

What tells the formats apart (checked in this order):

* ``mstream-v1``: the handshake starts with the magic ``2f df 1d 50``.
* ``mstream-v2``: the handshake is msgpack ``[[2, minor], bin(16)]``: ``92 92 02``.
* ``streamux``: a 5-byte initialize message, version 1, reserved bits 0, valid bit ranges.
* ``yamux``: 12-byte headers with version 0, a known type and flags; the first frame opens
  (SYN) a stream or pings.
* ``mstream-v3``: a msgpack array frame, the first an Offer (code 0).
* ``omnistreams``: 4-byte length prefixes, the first message a CREATE_RECEIVE_STREAM or
  CONTROL (spec numbering first, then the legacy one).
* ``mplex``: varint frames, the first a NEW_STREAM. ``multiplex`` is the same wire format
  and is reported as ``mplex``.

Besides the first bytes, the heads must decode without a violation. Returns ``None`` when
nothing fits, or both heads are empty.
"""

from __future__ import annotations

from polymux.exceptions import ProtocolError
from polymux.tracing.decode import decode_chunks
from polymux.tracing.records import C2S, S2C, FrameRecord
from polymux.wire import PROTOCOLS, streamux


__all__ = ["detect_format"]

_V1_MAGIC = bytes.fromhex("2fdf1d50")


def _decode(fmt: str, c2s: bytes, s2c: bytes) -> list[FrameRecord] | None:
    # one_way: the heads are cut short and fed one after the other, so the credit one side
    # grants may come after the data it allows: do not judge flow control here.
    chunks = [(0, d, data) for d, data in ((C2S, c2s), (S2C, s2c)) if data]
    records = list(decode_chunks(fmt, chunks, session="detect", one_way=True))
    if any(r.frame_type == "violation" for r in records):
        return None
    if not any(r.frame_type != "truncated" for r in records):
        return None
    return records


def _first(records: list[FrameRecord], direction: str) -> FrameRecord | None:
    for r in records:
        if r.direction == direction:
            return r
    return None


def _starts(
    records: list[FrameRecord], heads: dict[str, bytes], types: tuple[str, ...], answers: tuple[str, ...] = ()
) -> bool:
    """The client's first record is a complete one of ``types``; the server's is one of
    ``types``, one of ``answers`` on a channel the client opened, or cut short by the end
    of its head."""
    for direction, head in heads.items():
        if not head:
            continue
        first = _first(records, direction)
        if first is None:
            return False
        if first.frame_type in types:
            continue
        if direction == S2C and (
            first.frame_type == "truncated" or first.frame_type in answers and first.channel.startswith("c")
        ):
            continue
        return False
    return True


def _small_ids(records: list[FrameRecord]) -> bool:
    """The first channel each side names has a small id (a fresh connection's)."""
    for direction in (C2S, S2C):
        first = _first(records, direction)
        if first is not None and first.channel:
            digits = first.channel.lstrip("cs").split("#")[0]
            if not digits.isdigit() or int(digits) >= 1024:
                return False
    return True


def detect_format(c2s_head: bytes, s2c_head: bytes) -> str | None:
    """The wire format of a connection whose client sent ``c2s_head`` first and whose
    server sent ``s2c_head`` (either may be empty), or ``None`` when the bytes do not
    tell (see the module docstring for the rules)."""
    c2s, s2c = bytes(c2s_head), bytes(s2c_head)
    heads = {C2S: c2s, S2C: s2c}
    present = [h for h in (c2s, s2c) if h]
    if not present:
        return None
    if all(h[:4] == _V1_MAGIC[: len(h[:4])] for h in present) and any(len(h) >= 4 for h in present):
        return "mstream-v1"
    if all(h[:3] == b"\x92\x92\x02"[: len(h[:3])] for h in present) and any(len(h) >= 3 for h in present):
        return "mstream-v2"
    if all(h[0] == 1 and len(h) >= streamux.INIT_SIZE for h in present):
        try:
            inits = [streamux.decode_init(h[: streamux.INIT_SIZE]) for h in present]
            for init in inits:
                init.check()
            if len(inits) == 2:
                streamux.negotiate(*inits)
        except ProtocolError:
            pass
        else:
            return "streamux"
    if all(h[0] == 0 for h in present):
        records = _decode("yamux", c2s, s2c)
        if records is not None and _starts(records, heads, ("open", "ping", "open_ack", "pong", "go_away")):
            return "yamux"
    if all(h[0] in (0x93, 0x94) for h in present):
        records = _decode("mstream-v3", c2s, s2c)
        if records is not None and _starts(records, heads, ("open", "open_ack", "data")):
            return "mstream-v3"
    for fmt, create in (("omnistreams", 1), ("omnistreams-legacy", 0)):
        if fmt in PROTOCOLS and all(len(h) < 2 or h[:2] == b"\x00\x00" for h in present):
            records = _decode(fmt, c2s, s2c)
            if records is not None and _starts(records, heads, ("open", "control", "window_update")):
                return fmt
            # A first message longer than the head (creation metadata): its length prefix
            # and type byte, with the stream id 0 the first stream gets.
            if (
                len(c2s) >= 6
                and 0 < int.from_bytes(c2s[:4], "big") <= 1 << 24
                and c2s[4:6] == bytes((create, 0))
            ):
                return fmt
    records = _decode("mplex", c2s, s2c)
    if (
        records is not None
        and _starts(records, heads, ("open",), ("data", "end", "reset"))
        and _small_ids(records)
    ):
        return "mplex"
    return None
