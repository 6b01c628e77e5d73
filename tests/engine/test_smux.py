"""Tests of the sans-I/O smux engine (``polymux.engine.smux``), protocol versions 1 and 2.

Two engines, a client (odd stream ids from 3) and a server (even ids from 2), are joined by
``pump``: no sockets, no asyncio. Expected output bytes are spelled out in hex from
xtaci/smux (PROTOCOL-NOTES A6): an 8-byte header ``version | cmd | length u16 LE | stream id
u32 LE``; cmds SYN 0, FIN 1, PSH 2, NOP 3, UPD 4 (version 2: body consumed u32 LE, window
u32 LE). Input frames are built with ``polymux.wire.smux``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from polymux.config import SessionConfig
from polymux.engine.events import (
    ChannelClosed,
    ChannelEnded,
    ChannelOpened,
    CreditAvailable,
    DataReceived,
    Event,
    PingAcked,
)
from polymux.engine.smux import SmuxEngine
from polymux.exceptions import FlowControlError, ProtocolError
from polymux.formats import make_engine
from polymux.wire import smux as wire
from polymux.wire.smux import Cmd


KIB = 1024
MIB = 1024 * KIB
INITIAL = 256 * KIB


# -- helpers -----------------------------------------------------------------------------


def pair(version: int, **config: object) -> tuple[SmuxEngine, SmuxEngine]:
    """A client and a server engine of ``version`` with the same config."""
    cfg = SessionConfig(**config)  # type: ignore[arg-type]
    a = SmuxEngine(version, cfg, is_client=True)
    b = SmuxEngine(version, cfg, is_client=False)
    assert out(a) == b"" and out(b) == b""
    return a, b


def out(engine: SmuxEngine) -> bytes:
    """Everything ``engine`` wants to send, joined."""
    return b"".join(bytes(chunk) for chunk in engine.data_to_send())


def norm(events: list[Event]) -> list[Event]:
    """DataReceived parts joined into one ``bytes``."""
    return [
        DataReceived(e.channel, bytes(e.data) + b"".join(bytes(m) for m in e.more), e.flow_controlled_length)
        if isinstance(e, DataReceived)
        else e
        for e in events
    ]


def pump(src: SmuxEngine, dst: SmuxEngine) -> list[Event]:
    """Move ``src``'s output into ``dst``; return ``dst``'s events."""
    return norm(dst.receive_data(out(src)))


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def frame(version: int, cmd: int, sid: int, payload: bytes = b"") -> bytes:
    return wire.encode_header(version, cmd, sid, len(payload)) + payload


def upd(sid: int, consumed: int, window: int) -> bytes:
    return wire.encode_upd(2, sid, consumed, window)


def open_stream(a: SmuxEngine, b: SmuxEngine) -> tuple[int, int]:
    """``a`` opens a stream, ``b`` accepts it; return (a's handle, b's handle)."""
    ha = a.open_channel()
    [opened] = pump(a, b)
    assert isinstance(opened, ChannelOpened)
    b.accept_channel(opened.channel)
    assert pump(b, a) == []  # nothing acknowledges an open in smux
    return ha, opened.channel


def protocol_error(engine: SmuxEngine, raw: bytes, match: str) -> ProtocolError:
    with pytest.raises(ProtocolError, match=match) as info:
        engine.receive_data(raw)
    assert engine.closed
    assert info.value.format == engine.format
    return info.value


# -- construction ------------------------------------------------------------------------


def test_registered_names_and_versions() -> None:
    one = make_engine("smux", is_client=True)
    two = make_engine("smux-v2", is_client=False)
    assert isinstance(one, SmuxEngine) and (one.version, one.format, one.is_client) == (1, "smux", True)
    assert isinstance(two, SmuxEngine) and (two.version, two.format, two.is_client) == (2, "smux-v2", False)
    assert not one.has_flow_control and two.has_flow_control
    assert one.ready and not one.needs_acceptance and not one.ping_answered
    assert one.max_frame == 65535  # send_frame (64 KiB) capped by the u16 length
    assert SmuxEngine(1, SessionConfig(send_frame=32 * KIB)).max_frame == 32 * KIB


def test_bad_version() -> None:
    with pytest.raises(ValueError, match="version must be 1 or 2, got 3"):
        SmuxEngine(3)


# -- opening, data, ends: the bytes on the wire ------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_ids_and_syn_bytes(version: int) -> None:
    """The client opens 3, 5, ...; the server 2, 4, ... (xtaci: ``nextStreamID`` 1 / 0, +2
    before each open)."""
    a, b = pair(version, receive_window=INITIAL)  # 256 KiB: no window UPD needed
    a.open_channel(), a.open_channel()
    b.open_channel(), b.open_channel()
    v = f"{version:02x}"
    assert out(a) == h(f"{v} 00 0000 03000000 {v} 00 0000 05000000")
    assert out(b) == h(f"{v} 00 0000 02000000 {v} 00 0000 04000000")


def test_v1_echo_half_close_and_close_bytes() -> None:
    a, b = pair(1)
    ha = a.open_channel("files/1")
    assert a.channel_name(ha) == "files/1"  # local only: smux carries no names
    assert out(a) == h("01 00 0000 03000000")
    b_events = b.receive_data(h("01 00 0000 03000000"))
    [opened] = b_events
    assert isinstance(opened, ChannelOpened) and opened.name == "3"
    hb = opened.channel
    b.accept_channel(hb)
    assert out(b) == b""
    assert a.send_credit(ha) > 1 << 60  # version 1: no window
    a.send_data(ha, b"hello", b" world")
    raw = out(a)
    assert raw == h("01 02 0b00 03000000") + b"hello world"
    assert norm(b.receive_data(raw)) == [DataReceived(hb, b"hello world", 11)]
    assert a.end_channel(ha) is False
    assert out(a) == h("01 01 0000 03000000")
    b.receive_data(h("01 01 0000 03000000"))
    b.send_data(hb, b"bye")
    assert b.end_channel(hb) is True  # the peer's FIN had come: gone
    assert out(b) == h("01 02 0300 03000000") + b"bye" + h("01 01 0000 03000000")
    assert norm(a.receive_data(h("01 02 0300 03000000") + b"bye" + h("01 01 0000 03000000"))) == [
        DataReceived(ha, b"bye", 3),
        ChannelEnded(ha),
        ChannelClosed(ha),
    ]
    assert a.channel_count == 0 and b.channel_count == 0
    with pytest.raises(KeyError, match="no live channel"):
        a.end_channel(ha)


def test_end_channel_twice_sends_one_fin() -> None:
    a, b = pair(1)
    ha, _hb = open_stream(a, b)
    assert a.end_channel(ha) is False
    assert a.end_channel(ha) is False
    assert out(a) == h("01 01 0000 03000000")


def test_large_writes_are_split_into_frames_of_max_frame() -> None:
    a, b = pair(1, send_frame=1000)
    ha, hb = open_stream(a, b)
    payload = bytes(range(256)) * 10  # 2,560 bytes
    a.send_data(ha, payload)
    a.send_data(ha, b"")  # nothing to send
    raw = out(a)
    frames = wire.Decoder(1).feed(raw)
    assert [len(f.body) for f in frames] == [1000, 1000, 560]
    assert norm(b.receive_data(raw)) == [DataReceived(hb, payload, len(payload))]


def test_empty_psh_is_ignored() -> None:
    a, b = pair(1)
    _ha, hb = open_stream(a, b)
    assert b.receive_data(frame(1, Cmd.PSH, 3)) == []
    assert b.is_live(hb)


@pytest.mark.parametrize("version", [1, 2])
def test_unread_data_survives_both_fins(version: int) -> None:
    """Issue 25 item 4: after our FIN and then the peer's, every byte the peer sent is
    delivered before the end (xtaci v1.5.54+ would drop what is unread at that point)."""
    a, b = pair(version)
    ha, hb = open_stream(a, b)
    a.end_channel(ha)  # our half-close first
    b.receive_data(out(a))
    b.send_data(hb, b"x" * 70_000)
    b.end_channel(hb)
    events = pump(b, a)
    assert events == [DataReceived(ha, b"x" * 70_000, 70_000), ChannelEnded(ha), ChannelClosed(ha)]


# -- version 2 flow control --------------------------------------------------------------


def test_v2_window_announced_and_enforced() -> None:
    """Our 1 MiB window goes out right after SYN (and at accept); the peer may send up to
    consumed + window; one byte more is a flow-control error."""
    a, b = pair(2)  # receive_window 1 MiB
    ha = a.open_channel()
    assert out(a) == h("02 00 0000 03000000") + upd(3, 0, MIB)
    b.receive_data(h("02 00 0000 03000000") + upd(3, 0, MIB))
    [hb] = [r.handle for r in b._channels.values()]
    b.accept_channel(hb)
    assert b.send_credit(hb) == MIB  # the peer's announced window
    assert out(b) == upd(3, 0, MIB)
    a.receive_data(upd(3, 0, MIB))
    assert a.send_credit(ha) == MIB
    a.send_data(ha, bytes(MIB))
    events = b.receive_data(out(a))
    assert sum(e.flow_controlled_length for e in events if isinstance(e, DataReceived)) == MIB
    err = protocol_error(b, frame(2, Cmd.PSH, 3, b"!"), r"overran its receive window: 1048576 \+ 1 bytes")
    assert isinstance(err, FlowControlError)


def test_v2_initial_window_without_announcement() -> None:
    """With a 256 KiB window (what xtaci assumes before any UPD) nothing is announced."""
    a, b = pair(2, receive_window=INITIAL)
    ha, hb = open_stream(a, b)
    assert a.send_credit(ha) == INITIAL and b.send_credit(hb) == INITIAL
    a.send_data(ha, bytes(INITIAL))
    assert b.receive_data(out(a))
    with pytest.raises(FlowControlError):
        b.receive_data(frame(2, Cmd.PSH, 3, b"!"))


def test_v2_credit_goes_back_batched_as_consumed() -> None:
    a, b = pair(2)  # window 1 MiB, threshold 128 KiB
    ha, hb = open_stream(a, b)
    a.send_data(ha, bytes(MIB))
    b.receive_data(out(a))
    b.ack_consumed(hb, 100 * KIB)
    assert not b.has_output  # below the threshold
    b.ack_consumed(hb, 28 * KIB)
    b.ack_consumed(hb, 0)
    assert b.has_output
    b.ack_consumed(hb, 128 * KIB)  # one UPD per stream per batch, with the latest count
    assert out(b) == upd(3, 256 * KIB, MIB)
    assert a.send_credit(ha) == 0
    assert a.receive_data(upd(3, 256 * KIB, MIB)) == [CreditAvailable(ha)]
    assert a.send_credit(ha) == 256 * KIB
    assert a.receive_data(upd(3, 256 * KIB, MIB)) == []  # nothing new: no event


def test_v2_consumed_wraps_modulo_2_32() -> None:
    a, b = pair(2, receive_window=INITIAL)
    ha, _hb = open_stream(a, b)
    stream = a._by_wire[3]
    stream.peer_consumed = 0xFFFFFFF0  # as if 4 GiB had gone by
    a.send_data(ha, bytes(100))
    assert a.receive_data(upd(3, 0x100000000 + 0x20, INITIAL)) == []  # 0x30 consumed across the wrap
    assert a.send_credit(ha) == INITIAL - 100 + 0x30
    b_record = b._by_wire[3]
    b_record.acked = 2**32 - 1
    b_record.recv.outstanding = INITIAL  # type: ignore[union-attr]
    b.ack_consumed(b_record.handle, INITIAL)
    assert out(b)[8:12] == (INITIAL - 1).to_bytes(4, "little")  # (2**32 - 1 + INITIAL) mod 2**32


def test_v2_window_may_shrink() -> None:
    """xtaci's first UPD announces its 64 KiB MaxStreamBuffer after we had 256 KiB."""
    a, _b = pair(2, receive_window=INITIAL)
    ha = a.open_channel()
    out(a)
    a.send_data(ha, bytes(100 * KIB))
    assert a.receive_data(upd(3, 10, 64 * KIB)) == []
    assert a.send_credit(ha) == 0  # 100 KiB - 10 in flight > 64 KiB
    assert a.receive_data(upd(3, 100 * KIB, 64 * KIB)) == [CreditAvailable(ha)]
    assert a.send_credit(ha) == 64 * KIB


def test_v2_in_flight_over_all_streams_within_half_the_peer_buffer() -> None:
    """xtaci stops reading its connection while its session buffer (MaxReceiveBuffer) is
    full; a stream whose reader waits there for our credit would never read it. So all
    streams together keep half of smux_peer_buffer in flight, each still allowed up to one
    frame before the peer's first UPD (which its first read sends), then half the window it
    announced: enough to make it acknowledge, so the limit delays a stream, never stalls it."""
    a = SmuxEngine(2, SessionConfig(smux_peer_buffer=2 * MIB), is_client=True)
    handles = [a.open_channel() for _ in range(8)]
    out(a)
    f = a.max_frame
    for h in handles:
        a.send_data(h, bytes(a.send_credit(h)))
    assert [a._channels[h].send.in_flight for h in handles] == [INITIAL] * 4 + [f] * 4
    assert all(a.send_credit(h) == 0 for h in handles)  # all held back now
    # The peer read all of stream 3 and announced its 64 KiB window: room for the others.
    events = a.receive_data(upd(3, INITIAL, 64 * KIB))
    # (stream 3 by its own window; the last four, which the limit held back)
    assert sorted(e.channel for e in events if isinstance(e, CreditAvailable)) == [handles[0], *handles[4:]]
    assert a.send_credit(handles[4]) == INITIAL - 4 * f  # the freed room, less what is over
    a.send_data(handles[4], bytes(INITIAL - 4 * f))
    assert a.send_credit(handles[5]) == 0  # the limit is full again
    # A stream that heard from the peer may always reach half the window it announced.
    assert a.send_credit(handles[0]) == 32 * KIB
    # A stream that is gone gives back what it had in flight.
    a.reset_channel(handles[1])
    a.receive_data(frame(2, Cmd.FIN, 5))
    assert handles[1] not in a._channels
    assert a.send_credit(handles[0]) == 64 * KIB


def test_v2_without_a_session_limit_version_1() -> None:
    """Version 1 has no credit on the wire: nothing to hold back."""
    a = SmuxEngine(1, SessionConfig(smux_peer_buffer=64 * KIB), is_client=True)
    h = a.open_channel()
    assert a.send_credit(h) > MIB


def test_v2_upd_claiming_more_than_sent() -> None:
    a, _b = pair(2)
    ha = a.open_channel()
    out(a)
    a.send_data(ha, bytes(10))
    protocol_error(
        a, upd(3, 11, MIB), r"UPD on stream 3 says 11 more bytes were consumed, but 10 were in flight"
    )


def test_v2_no_credit_for_a_stream_whose_fin_arrived() -> None:
    """Credit due when the peer's FIN arrives is not sent; nor after it."""
    a, b = pair(2)
    ha, hb = open_stream(a, b)
    a.send_data(ha, bytes(200 * KIB))
    b.receive_data(out(a))
    b.ack_consumed(hb, 200 * KIB)  # due, not yet taken
    a.end_channel(ha)
    b.receive_data(out(a))  # the FIN
    assert out(b) == b""
    b.ack_consumed(hb, 10)
    assert not b.has_output


def test_v2_credit_dropped_for_a_forgotten_stream() -> None:
    a, b = pair(2)
    ha, hb = open_stream(a, b)
    a.send_data(ha, bytes(200 * KIB))
    b.receive_data(out(a))
    b.ack_consumed(hb, 200 * KIB)
    b.reset_channel(hb)
    assert out(b) == h("02 01 0000 03000000")  # the FIN only
    b.ack_consumed(hb, 10)  # gone: nothing
    assert not b.has_output


def test_v2_credit_after_our_own_fin() -> None:
    """After our half-close we still read: credit still goes back."""
    a, b = pair(2)
    ha, hb = open_stream(a, b)
    a.end_channel(ha)
    b.receive_data(out(a))
    b.send_data(hb, bytes(200 * KIB))
    a.receive_data(out(b))
    a.ack_consumed(ha, 200 * KIB)
    assert out(a) == upd(3, 200 * KIB, MIB)


def test_v2_upd_after_fins_and_for_gone_streams() -> None:
    a, b = pair(2)
    ha, hb = open_stream(a, b)
    b.end_channel(hb)
    a.receive_data(out(b))
    assert a.receive_data(upd(3, 0, 2 * MIB)) == []  # after the peer's FIN: still taken
    assert a.send_credit(ha) == 2 * MIB
    a.end_channel(ha)
    assert a.receive_data(upd(3, 0, MIB)) == []  # gone: dropped


def test_windows_fit_half_the_memory_budget() -> None:
    """Version 2 windows share half the session's budget (the other half is for what we
    write), shrinking as it fills, down to 64 KiB."""
    a, _b = pair(2, max_session_memory=4 * MIB, receive_window=MIB)
    windows = []
    for _ in range(12):
        handle = a.open_channel()
        windows.append(a._by_wire[a._channels[handle].wire_id].window)
    assert windows[0] == 512 * KIB  # a quarter of the 2 MiB half
    assert windows == sorted(windows, reverse=True) and windows[-1] == 64 * KIB
    assert sum(windows[:-3]) <= 2 * MIB
    assert a._granted == sum(windows)
    a.reset_channel(1)
    assert a._granted == sum(windows[1:])


def test_v2_window_below_the_initial_256k() -> None:
    """A 64 KiB window (xtaci's default) is announced, but the peer may already have sent on
    its first guess of 256 KiB: that allowance shrinks as we acknowledge, down to 64 KiB."""
    a, b = pair(2, receive_window=64 * KIB)
    ha = a.open_channel()
    assert out(a) == h("02 00 0000 03000000") + upd(3, 0, 64 * KIB)
    [opened] = norm(b.receive_data(h("02 00 0000 03000000")))  # our UPD not yet read by b
    b.accept_channel(opened.channel)  # type: ignore[attr-defined]
    b.send_data(opened.channel, bytes(INITIAL))  # type: ignore[attr-defined]
    b_out = out(b)
    assert b_out.startswith(upd(3, 0, 64 * KIB))  # b's own window announcement
    events = a.receive_data(b_out)
    assert sum(e.flow_controlled_length for e in events if isinstance(e, DataReceived)) == INITIAL
    record = a._by_wire[3]
    assert record.recv is not None and record.recv.window == INITIAL
    a.ack_consumed(ha, 200 * KIB)
    assert out(a) == upd(3, 200 * KIB, 64 * KIB)
    assert record.recv.window == 64 * KIB  # max(64 KiB, 256 KiB - 200 KiB)
    a.receive_data(frame(2, Cmd.PSH, 3, bytes(8 * KIB)))  # 56 + 8 = 64 KiB outstanding: fine
    with pytest.raises(FlowControlError, match=r"65536 \+ 1 bytes > window 65536"):
        a.receive_data(frame(2, Cmd.PSH, 3, b"!"))


def test_v1_has_no_credit() -> None:
    a, b = pair(1)
    ha, hb = open_stream(a, b)
    a.send_data(ha, bytes(5 * MIB))
    assert (
        sum(e.flow_controlled_length for e in b.receive_data(out(a)) if isinstance(e, DataReceived))
        == 5 * MIB
    )
    b.ack_consumed(hb, 5 * MIB)
    assert not b.has_output


# -- keepalive ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_ping_is_a_nop_acknowledged_by_the_next_frame(version: int) -> None:
    a, b = pair(version)
    first, second = a.ping(), a.ping()
    assert first != second
    assert out(a) == h(f"{version:02x} 03 0000 00000000") * 2
    assert b.receive_data(h(f"{version:02x} 03 0000 00000000")) == []  # nothing answers a NOP
    assert out(b) == b""
    assert a.receive_data(h(f"{version:02x} 03 0000 00000000")[:5]) == []  # half a frame: not yet
    assert a.receive_data(h(f"{version:02x} 03 0000 00000000")[5:]) == [PingAcked(first), PingAcked(second)]
    assert a.receive_data(h(f"{version:02x} 03 0000 00000000")) == []  # nothing outstanding


def test_any_frame_acknowledges_a_ping_after_its_own_events() -> None:
    a, b = pair(1)
    b.open_channel()
    opaque = a.ping()
    events = pump(b, a)
    assert isinstance(events[0], ChannelOpened) and events[1:] == [PingAcked(opaque)]


# -- accept, reject, reset -----------------------------------------------------------------


def test_reject_sends_fin_and_forgets() -> None:
    a, b = pair(1)
    ha = a.open_channel()
    [opened] = pump(a, b)
    assert isinstance(opened, ChannelOpened)
    b.reject_channel(opened.channel)
    assert out(b) == h("01 01 0000 03000000")
    assert not b.is_live(opened.channel)
    a.send_data(ha, b"late")
    assert b.receive_data(out(a)) == []  # data for the rejected stream: dropped


def test_reject_delivers_fin_to_the_opener() -> None:
    a, b = pair(1)
    ha = a.open_channel()
    [opened] = pump(a, b)
    b.reject_channel(opened.channel)  # type: ignore[attr-defined]
    assert pump(b, a) == [ChannelEnded(ha)]


@pytest.mark.parametrize("method", ["accept_channel", "reject_channel"])
def test_accept_or_reject_only_pending_incoming(method: str) -> None:
    a, b = pair(1)
    ha, hb = open_stream(a, b)
    with pytest.raises(RuntimeError, match="not a pending incoming stream"):
        getattr(a, method)(ha)
    with pytest.raises(RuntimeError, match="not a pending incoming stream"):
        getattr(b, method)(hb)


def test_reset_sends_fin_once_and_drops_what_follows() -> None:
    a, b = pair(1)
    ha, hb = open_stream(a, b)
    a.reset_channel(ha, "carried nowhere")
    assert out(a) == h("01 01 0000 03000000")
    a.reset_channel(ha)  # gone: nothing
    assert out(a) == b""
    assert pump(a, b) == []
    b.receive_data(h("01 01 0000 03000000"))  # a's FIN
    b.send_data(hb, b"too late")
    b.end_channel(hb)
    assert pump(b, a) == []  # dropped: a forgot the stream


def test_reset_after_half_close_sends_no_second_fin() -> None:
    a, b = pair(1)
    ha, _hb = open_stream(a, b)
    a.end_channel(ha)
    out(a)
    a.reset_channel(ha)
    assert out(a) == b""
    assert not a.is_live(ha)


def test_cannot_send_after_end() -> None:
    a, b = pair(1)
    ha, _hb = open_stream(a, b)
    a.end_channel(ha)
    assert a.send_credit(ha) == 0
    with pytest.raises(RuntimeError, match="cannot send"):
        a.send_data(ha, b"x")


def test_ids_run_out() -> None:
    a, _b = pair(1)
    a._next_id = 2**32 - 1
    a.open_channel()
    with pytest.raises(RuntimeError, match="stream ids are exhausted"):
        a.open_channel()


def test_close_sends_nothing() -> None:
    a, _b = pair(2)
    a.close()
    assert out(a) == b""
    assert a.can_open


# -- what the peer may and may not send --------------------------------------------------


def test_repeated_fin_is_ignored() -> None:
    """xtaci's ``Close()`` after ``CloseWrite()`` sends a second FIN."""
    a, b = pair(1)
    ha, _hb = open_stream(a, b)
    assert a.receive_data(h("01 01 0000 03000000") * 2) == [ChannelEnded(ha)]


def test_data_after_fin_is_dropped() -> None:
    """xtaci's writers can send PSH frames after their FIN when a stream is closed during a
    write: dropped, the session goes on."""
    a, b = pair(1)
    ha, _hb = open_stream(a, b)
    events = a.receive_data(h("01 01 0000 03000000") + frame(1, Cmd.PSH, 3, b"late") + frame(1, Cmd.NOP, 0))
    assert events == [ChannelEnded(ha)]
    assert not a.closed


def test_frames_for_streams_that_are_gone_are_dropped() -> None:
    a, b = pair(2)
    ha, hb = open_stream(a, b)
    b.end_channel(hb)
    a.end_channel(ha)
    a.receive_data(out(b))
    assert not a.is_live(ha)
    for cmd, payload in ((Cmd.PSH, b"x"), (Cmd.FIN, b""), (Cmd.UPD, bytes(8))):
        assert a.receive_data(frame(2, cmd, 3, payload)) == []
    # a stream the peer opened and that is gone, too
    hb2 = b.open_channel()
    [opened] = pump(b, a)
    a.reject_channel(opened.channel)  # type: ignore[attr-defined]
    assert a.receive_data(frame(2, Cmd.PSH, 2, b"x")) == []
    assert b.is_live(hb2)


@pytest.mark.parametrize(
    ("client", "raw", "match"),
    [
        (True, frame(1, Cmd.PSH, 5, b"x"), r"PSH frame for stream 5, which was never opened"),  # ours, unused
        (True, frame(1, Cmd.FIN, 4), r"FIN frame for stream 4, which was never opened"),  # theirs, no SYN
        (False, frame(1, Cmd.PSH, 7, b"x"), r"PSH frame for stream 7, which was never opened"),
        (True, frame(1, Cmd.SYN, 7), r"SYN for stream 7, an id of our parity"),
        (False, frame(1, Cmd.SYN, 2), r"SYN for stream 2, an id of our parity"),
        (True, frame(1, Cmd.SYN, 2) + frame(1, Cmd.SYN, 2), r"SYN for stream 2, which is already open"),
    ],
)
def test_protocol_errors(client: bool, raw: bytes, match: str) -> None:
    engine = SmuxEngine(1, is_client=client)
    if client:
        engine.open_channel()  # stream 3
    protocol_error(engine, raw, match)
    with pytest.raises(ProtocolError, match="after the session ended"):
        engine.receive_data(frame(1, Cmd.NOP, 0))


def test_upd_for_a_stream_never_opened() -> None:
    engine = SmuxEngine(2, is_client=False)
    protocol_error(engine, upd(9, 0, 1), r"UPD frame for stream 9, which was never opened")


def test_codec_errors_end_the_engine() -> None:
    engine = SmuxEngine(1)
    protocol_error(engine, frame(2, Cmd.NOP, 0), r"version is 2, expected 1")
    engine = SmuxEngine(1)
    protocol_error(
        engine, h("01 04 0800 03000000") + bytes(8), r"UPD \(cmd 4\) on stream 3 in protocol version 1"
    )


def test_peer_ids_from_older_servers_and_stream_zero() -> None:
    """Before v1.0.7 an xtaci server's first stream was 4; a spec-reading server may use 0."""
    a = SmuxEngine(1, is_client=True)
    events = a.receive_data(frame(1, Cmd.SYN, 4) + frame(1, Cmd.SYN, 0) + frame(1, Cmd.PSH, 0, b"z"))
    assert [type(e) for e in events] == [ChannelOpened, ChannelOpened, DataReceived]


def test_eof_inside_a_frame() -> None:
    a = SmuxEngine(1)
    a.receive_eof()
    b = SmuxEngine(1)
    b.receive_data(frame(1, Cmd.PSH, 2, b"abc")[:4])
    with pytest.raises(ProtocolError, match=r"connection ended inside a frame \(4 bytes of it received\)"):
        b.receive_eof()
    c = SmuxEngine(1, is_client=False)
    c.receive_data(frame(1, Cmd.PSH, 3, b"abc")[:9])
    with pytest.raises(ProtocolError, match=r"inside a frame on stream 3 \(9 bytes"):
        c.receive_eof()


# -- properties --------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2]), st.lists(st.integers(0, 70_000), min_size=1, max_size=6), st.data())
def test_transfer_any_sizes_and_chunking(version: int, sizes: list[int], data: st.DataObject) -> None:
    """Streams opened from both sides carry their bytes whole, whatever the chunking of the
    connection, with credit returned as read (version 2)."""
    a, b = pair(version)
    todo = []  # (engine, handle, bytes still to send)
    for i, size in enumerate(sizes):
        src = a if i % 2 == 0 else b
        todo.append((src, src.open_channel(), bytes([i]) * size))
    got: dict[tuple[int, int], bytearray] = {}
    for _ in range(1000):
        if not todo and not a.has_output and not b.has_output:
            break
        for item in list(todo):
            src, handle, rest = item
            n = min(src.send_credit(handle), len(rest))
            src.send_data(handle, rest[:n])
            todo.remove(item)
            if rest[n:]:
                todo.append((src, handle, rest[n:]))
            else:
                src.end_channel(handle)
        for src, dst in ((a, b), (b, a)):
            raw = out(src)
            while raw:
                cut = data.draw(st.integers(1, len(raw)))
                chunk, raw = raw[:cut], raw[cut:]
                for event in norm(dst.receive_data(chunk)):
                    key = (id(dst), getattr(event, "channel", 0))
                    if isinstance(event, ChannelOpened):
                        dst.accept_channel(event.channel)
                        got[key] = bytearray()
                    elif isinstance(event, DataReceived):
                        got.setdefault(key, bytearray()).extend(event.data)
                        dst.ack_consumed(event.channel, event.flow_controlled_length)
    assert not todo
    received = sorted(bytes(v) for v in got.values() if v)
    assert received == sorted(bytes([i]) * size for i, size in enumerate(sizes) if size)
