"""yamux (hashicorp): the format's definition, its frame-record walk and its signature.

The codec is :mod:`polymux.wire.yamux`, the engine :class:`polymux.engine.yamux.YamuxEngine`
(with its capabilities and :class:`~polymux.engine.yamux.YamuxOptions`).
"""

from __future__ import annotations

import dataclasses
from array import array
from typing import Any

from polymux.config import SessionConfig
from polymux.engine.base import Engine
from polymux.engine.yamux import CAPABILITIES, YamuxEngine, YamuxOptions
from polymux.formats.columns import CREDIT_DIRS, FRAME_TYPE_CODES, RecordColumns
from polymux.formats.format import Format, FormatDocs
from polymux.formats.records import FrameRecord
from polymux.formats.scan import yamux_starts
from polymux.formats.signature import Fit, Probe, Signature, first, frame_confidence, frames, starts
from polymux.formats.walk import OTHER, Codec, Credit, FastHeader, Violation, Walk, WalkHost, new_record
from polymux.wire import yamux as wire


__all__ = ["YAMUX", "YamuxWalk"]


_DATA = FRAME_TYPE_CODES["data"]
_WINDOW_UPDATE = FRAME_TYPE_CODES["window_update"]
_HEAD = [("version", "u1"), ("type", "u1"), ("flags", ">u2"), ("sid", ">u4"), ("length", ">u4")]
"""The header as a numpy record (wire.HEADER, ``>BBHII``)."""
_numpy_head: tuple[Any, Any] | None = None


def _head_layout() -> tuple[Any, Any]:
    """(the header's 12 byte offsets, its numpy record type), made once."""
    global _numpy_head
    if _numpy_head is None:
        import numpy as np

        _numpy_head = (np.arange(12), np.dtype(_HEAD))
    return _numpy_head


def _cumsum_by(values: Any, group: Any) -> Any:
    """Per element, the sum of ``values`` of its ``group`` up to it (itself included)."""
    import numpy as np

    order = np.argsort(group, kind="stable")
    ordered = values[order]
    sums = np.cumsum(ordered)
    keys = group[order]
    first = np.ones(len(keys), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    before = (sums - ordered)[first]  # the sum before each group's first element
    out = np.empty_like(sums)
    out[order] = sums - np.repeat(before, np.diff(np.append(np.flatnonzero(first), len(keys))))
    return out


class YamuxWalk(Walk):
    """yamux: stream ids are session-wide (client odd, server even); 256 KiB windows each
    way from the start, grown by WindowUpdate deltas (also on SYN/ACK frames); only Data
    bytes count."""

    MAX_DATA = YamuxOptions().max_receive_window
    """The largest window go-yamux and polymux grow a stream's to: the largest data frame."""

    def __init__(self, decoder: WalkHost) -> None:
        super().__init__(decoder)
        self.wire = wire
        self.credit: dict[tuple[int, str], Credit] = {}

    def codec(self, direction: str) -> Codec:
        return self.wire.Decoder(self.MAX_DATA, self.fmt)

    def size(self, item: Any) -> int:
        return 12 + (len(item.body) if item.type == 0 else 0)

    MAX_HEAD = 12

    def fast_header(self, direction: str, buf: Any, pos: int, end: int) -> FastHeader | bool | None:
        if end - pos < 12:
            return None
        version, type_, flags, sid, length = self.wire.HEADER.unpack_from(buf, pos)
        if version or type_ > 3:
            return False
        if type_:
            return 12, 0, False, (type_, flags, sid, length)
        if length > self.MAX_DATA:
            return False
        return 12, length, True, (0, flags, sid, length)

    def fast_item(self, fields: tuple[Any, ...], payload: Any) -> Any:
        type_, flags, sid, length = fields
        return self.wire.Frame(type_, flags, sid, length, payload)

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
        # plain Data frames (their sender's credit) and plain WindowUpdates (the other's)
        if self.decoder.one_way:
            return pos
        unpack = self.wire.HEADER.unpack_from
        credits = self.credit
        other = OTHER[direction]
        session = self.decoder.session
        fmt = self.fmt
        append = out.append
        base = offset - pos
        max_data = self.MAX_DATA
        new = new_record
        record_type = FrameRecord
        mine: dict[int, tuple[Credit, str]] = {}  # stream id -> (credit, key), for this run
        theirs: dict[int, tuple[Credit, str]] = {}
        while end - pos >= 12:
            version, type_, flags, sid, length = unpack(buf, pos)
            if version or flags or type_ > 1 or not sid or not length:
                break
            if type_:
                entry = theirs.get(sid)
                if entry is None:
                    credit = credits.get((sid, other))
                    if credit is None:
                        break
                    entry = theirs[sid] = (credit, str(sid))
                credit, channel = entry
                credit.window += length
                left = (credit.window or 0) - credit.in_flight
                append(new(record_type, (session, direction, time_ns, fmt, base + pos, channel, "window_update", length, 0, left, other, None, None, None)))  # fmt: skip
                if payloads is not None:
                    payloads.append(b"")
                pos += 12
                continue
            stop = pos + 12 + length
            if stop > end or length > max_data:
                break
            entry = mine.get(sid)
            if entry is None:
                credit = credits.get((sid, direction))
                if credit is None:
                    break
                entry = mine[sid] = (credit, str(sid))
            credit, channel = entry
            left = (credit.window or 0) - credit.in_flight - length
            if left < 0:
                break
            credit.in_flight += length
            append(new(record_type, (session, direction, time_ns, fmt, base + pos, channel, "data", length, 0, left, direction, None, None, None)))  # fmt: skip
            if payloads is not None:
                payloads.append(bytes(buf[pos + 12 : pos + 12 + min(prefix, length)]))
            pos = stop
        return pos

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
        # fast_run's frames (plain Data, plain WindowUpdate), numpy over all the headers;
        # the records and credits exactly as fast_run gives them
        if self.decoder.one_way:
            return pos
        starts: array[int] = array("q")
        stop = yamux_starts(buf, pos, end, self.MAX_DATA, starts)
        n = len(starts)
        if n < self.COLUMN_RUN_MIN:
            return pos
        import numpy as np

        at = np.frombuffer(starts, np.int64)
        offsets, record = _head_layout()
        heads = np.frombuffer(buf, np.uint8)[at[:, None] + offsets].view(record).reshape(n)
        kind = heads["type"]
        length = heads["length"].astype(np.int64)
        # the credit each frame changes: its sender's (Data) or the other's (WindowUpdate);
        # one the capture did not show opening starts at the initial window (as records()
        # has it)
        other = OTHER[direction]
        groups, group = np.unique(heads["sid"].astype(np.int64) * 2 + kind, return_inverse=True)
        credits = [self._credit(k >> 1, other if k & 1 else direction) for k in groups.tolist()]
        start = np.fromiter(((c.window or 0) - c.in_flight for c in credits), np.int64, len(credits))
        left = start[group] + _cumsum_by(np.where(kind == 1, length, -length), group)
        over = np.flatnonzero((kind == 0) & (left < 0))
        if len(over):  # an overrun: the general path gives its violation
            n = int(over[0])
            if not n:
                return pos
            kind, length, group, left = kind[:n], length[:n], group[:n], left[:n]
        totals = np.bincount(group, weights=length, minlength=len(credits)).astype(np.int64).tolist()
        for k, credit in enumerate(credits):
            if totals[k]:
                if groups[k] & 1:
                    credit.window = (credit.window or 0) + totals[k]
                else:
                    credit.in_flight += totals[k]
        channels = np.fromiter(
            (columns.channel_code(str(g >> 1)) for g in groups.tolist()), np.int32, len(groups)
        )
        window = kind == 1
        columns.add(
            time_ns,
            direction,
            offset - pos + at[:n],
            channels[group],
            np.where(window, _WINDOW_UPDATE, _DATA).astype(np.int8),
            length,
            np.zeros(n, np.int64),
            left,
            np.where(window, CREDIT_DIRS.index(other), CREDIT_DIRS.index(direction)).astype(np.int8),
            np.full(n, -1, np.int32),
        )
        if n == len(at):
            return stop
        return int(at[n])

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
        sid = fields[2]
        credit = self.credit.get((sid, direction))
        if not data or not length or fields[1] or credit is None or self.decoder.one_way:
            return None
        left = credit.left - length
        if left < 0:
            return None
        credit.in_flight += length
        return new_record(
            FrameRecord,
            (
                self.decoder.session, direction, time_ns, self.fmt, offset, str(sid), "data",
                length, 0, left, direction, None, None, None,
            ),
        )  # fmt: skip

    def payload(self, item: Any) -> Any:
        return item.body

    def _credit(self, sid: int, direction: str) -> Credit:
        c = self.credit.get((sid, direction))
        if c is None:
            c = self.credit[(sid, direction)] = Credit(self.wire.INITIAL_WINDOW)
        return c

    def _charge(self, sid: int, direction: str, n: int, out: list[FrameRecord]) -> int:
        """``n`` data bytes sent on ``sid``: the credit left (a violation when the sender
        overran it; ``out``: the frame's records so far)."""
        credit = self.credit.get((sid, direction)) or self._credit(sid, direction)
        credit.in_flight += n
        left = credit.left
        if left < 0 and not self.decoder.one_way:
            raise Violation(
                f"{self.fmt}: stream {sid} overran its send window: {n} bytes with {left + n} left", out
            )
        return left

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        type_, flags, sid, length = item.type, item.flags, item.stream_id, item.length
        if type_ == 0 and not flags and length and not self.decoder.one_way:
            # The bulk of any capture: plain data, one record (the general path below gives
            # the same record, through more steps).
            left = self._charge(sid, direction, length, [])
            dec = self.decoder
            return [
                new_record(FrameRecord, (
                    dec.session, direction, time_ns, self.fmt, offset, str(sid), "data", length, 0,
                    left, direction, None, None, None,
                ))
            ]  # fmt: skip
        rec = self.rec
        if type_ == 2:  # ping
            kind = "pong" if flags & 2 else "ping"
            return [rec(direction, time_ns, offset, "", kind, 0, flags, ping_id=length)]
        if type_ == 3:  # go away
            names = {0: "normal", 1: "protocol error", 2: "internal error"}
            error = None if length == 0 else f"go away code {length} ({names.get(length, 'unknown')})"
            return [rec(direction, time_ns, offset, "", "go_away", 0, flags, error=error)]
        channel = str(sid) if sid else ""
        other = OTHER[direction]
        out: list[FrameRecord] = []
        if type_ == 1:  # window update: the delta grows the other direction's credit
            grant = self._credit(sid, other)
            grant.window += length
            if flags & 1:
                out.append(rec(direction, time_ns, offset, channel, "open", length, flags, grant.left, other))
            elif flags & 2:
                out.append(
                    rec(direction, time_ns, offset, channel, "open_ack", length, flags, grant.left, other)
                )
            elif length or not flags & 12:
                out.append(
                    rec(
                        direction, time_ns, offset, channel, "window_update", length, flags, grant.left, other
                    )
                )
        else:  # data
            if flags & 1:
                out.append(rec(direction, time_ns, offset, channel, "open", 0, flags))
            elif flags & 2:
                out.append(rec(direction, time_ns, offset, channel, "open_ack", 0, flags))
            n = len(item.body)
            if n or not flags & 15:
                left = self._charge(sid, direction, n, out)
                out.append(rec(direction, time_ns, offset, channel, "data", n, flags, left, direction))
        if flags & 8:
            out.append(rec(direction, time_ns, offset, channel, "reset", 0, flags))
        elif flags & 4:
            out.append(rec(direction, time_ns, offset, channel, "end", 0, flags))
        return out


# -- the signature ---------------------------------------------------------------------------


def _session_frame(record: FrameRecord) -> bool:
    """A yamux ping (SYN or ACK) or go-away on stream 0, whole."""
    if record.channel != "" or record.frame_type not in ("ping", "pong", "go_away"):
        return False
    return record.flags in ((0,) if record.frame_type == "go_away" else (1, 2))


def _fits(probe: Probe) -> list[Fit]:
    """12-byte headers with version 0, a known type and flags; the client's first frame
    opens (SYN) a stream or pings."""
    c2s, s2c = probe.c2s, probe.s2c
    if not all(h[0] == 0 for h in (c2s, s2c) if h):
        return []
    records = probe.decode(YAMUX)
    # A client starts by opening a stream or pinging; the server may also answer.
    if (
        records is None
        or not starts(records, {"c2s": c2s}, ("open", "ping"))
        or not starts(records, {"s2c": s2c}, ("open", "ping", "open_ack", "pong", "go_away"))
    ):
        return []
    head = first(records, "c2s") or first(records, "s2c")
    n = frames(records)
    fit = Fit(
        "yamux",
        frame_confidence(n),
        f"{n} yamux frame{'s' * (n != 1)}, the first: {head.frame_type if head else '?'}",
    )
    if head is not None and _session_frame(head):
        # A ping or go-away on stream 0: 8 of its 12 bytes are fixed (version, type, flags,
        # stream id): as telling as a magic number. A yamux server pings at once, and
        # answers bytes it cannot parse with a go-away.
        fit.confidence = max(fit.confidence, 0.95)
        fit.evidence += f" on stream 0 (a yamux {head.frame_type}: 8 of its 12 bytes are fixed)"
    return [fit]


# -- the format ------------------------------------------------------------------------------


_DEFAULT_WINDOW = SessionConfig().receive_window


def _receive_window(fmt: Format, config: SessionConfig) -> Format:
    """``receive_window`` on yamux: a stream's window starts at the 256 KiB the format fixes
    and grows while its reader keeps up, so a ``receive_window`` of 256 KiB or more is
    applied as the most it grows to (:attr:`YamuxOptions.max_receive_window`, unless that
    is set), and a smaller one, which the format cannot honour, is refused."""
    window = config.receive_window
    if window == _DEFAULT_WINDOW:
        return fmt
    if window < wire.INITIAL_WINDOW:
        raise ValueError(
            f"yamux cannot honour receive_window={window}: a yamux stream's window starts at the "
            f"{wire.INITIAL_WINDOW // 1024} KiB the format fixes (the peer may always send that much "
            "unread); a receive_window of 256 KiB or more caps how far it grows, as "
            "YamuxOptions.max_receive_window does (polymux.formats.get('yamux').configure(max_receive_window=...))"
        )
    options = fmt.options
    assert isinstance(options, YamuxOptions)
    if (
        config.max_receive_window is not None
        or options.max_receive_window != YamuxOptions().max_receive_window
    ):
        return fmt  # set explicitly: that wins
    return dataclasses.replace(fmt, options=dataclasses.replace(options, max_receive_window=window))


def _engine(fmt: Format, config: SessionConfig, is_client: bool, message_mode: bool) -> Engine:
    assert isinstance(fmt.options, YamuxOptions)
    return YamuxEngine(config, is_client=is_client, options=fmt.options)


YAMUX: Format = Format(
    "yamux",
    "yamux (hashicorp)",
    "yamux",
    CAPABILITIES,
    _engine,
    YamuxWalk,
    Signature(_fits, rank=10),
    YamuxOptions(),
    FormatDocs(
        page="formats/yamux.md",
        tested_against="npm `@chainsafe/libp2p-yamux`, Go `hashicorp/yamux`",
        credit="a window per stream from 256 KiB, grown while the reader keeps up",
        names="the acceptor sees the stream id",
        pings="pings measure the round trip",
        limits="32-bit stream ids; at most `max_unacked_opens` opens awaiting the peer's acknowledgement",
    ),
    legacy=_receive_window,
)
"""yamux."""
