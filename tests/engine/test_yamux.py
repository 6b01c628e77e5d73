"""Tests of the sans-I/O yamux engine (``polymux.engine.yamux``).

Two engines, a client (odd stream ids) and a server (even ids), are joined by ``pump``: no
sockets, no asyncio. Time is simulated by setting ``engine.now``. Expected output bytes are
spelled out in hex from hashicorp/yamux ``spec.md`` (PROTOCOL-NOTES A5): a 12-byte header
``version 00 | type | flags u16 | stream id u32 | length u32``, types 0 Data, 1 WindowUpdate,
2 Ping, 3 GoAway, flags SYN 1, ACK 2, FIN 4, RST 8. Input frames are built with
``polymux.wire.yamux.encode_header``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from polymux.config import SessionConfig
from polymux.engine.events import (
    ChannelAccepted,
    ChannelClosed,
    ChannelEnded,
    ChannelOpened,
    ChannelReset,
    CreditAvailable,
    DataReceived,
    Event,
    PingAcked,
    SessionClosed,
)
from polymux.engine.yamux import YamuxEngine
from polymux.exceptions import FlowControlError, LimitExceeded, ProtocolError
from polymux.formats import make_engine
from polymux.wire import yamux as wire
from polymux.wire.yamux import Flag as F, Frame, Type as T


KIB = 1024
MIB = 1024 * 1024
WINDOW = 256 * KIB
HALF = WINDOW // 2


# -- helpers -----------------------------------------------------------------------------


def pair(**config: int) -> tuple[YamuxEngine, YamuxEngine]:
    """A client and a server engine with the same config (both start quiet)."""
    cfg = SessionConfig(**config)
    a = YamuxEngine(cfg, is_client=True)
    b = YamuxEngine(cfg, is_client=False)
    assert out(a) == b"" and out(b) == b""
    return a, b


def out(engine: YamuxEngine) -> bytes:
    """Everything ``engine`` wants to send, joined."""
    return b"".join(bytes(chunk) for chunk in engine.data_to_send())


def norm(events: list[Event]) -> list[Event]:
    """Join DataReceived parts into one ``bytes`` (decoded ones are memoryviews)."""
    return [
        DataReceived(e.channel, bytes(e.data) + b"".join(bytes(m) for m in e.more), e.flow_controlled_length)
        if isinstance(e, DataReceived)
        else e
        for e in events
    ]


def pump(src: YamuxEngine, dst: YamuxEngine) -> list[Event]:
    """Move ``src``'s pending output into ``dst``; return ``dst``'s events (payloads as bytes)."""
    return norm(dst.receive_data(out(src)))


def hdr(type_: int, flags: int, stream_id: int, length: int) -> bytes:
    return wire.encode_header(type_, flags, stream_id, length)


def data(stream_id: int, payload: bytes, flags: int = 0) -> bytes:
    return hdr(T.DATA, flags, stream_id, len(payload)) + payload


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def wu(stream_id: int, flags: int = 0, delta: int = 0) -> str:
    """The hex of a WindowUpdate frame."""
    return f"00 01 {flags:04x} {stream_id:08x} {delta:08x}"


GOAWAY_NORMAL = h("00 03 0000 00000000 00000000")
GOAWAY_PROTOCOL = h("00 03 0000 00000000 00000001")


def decoded(raw: bytes) -> list[Frame]:
    dec = wire.Decoder(2**32 - 1)
    frames = [f._replace(body=bytes(f.body)) for f in dec.feed(raw)]
    assert dec.pending == 0
    return frames


def open_stream(a: YamuxEngine, b: YamuxEngine) -> tuple[int, int]:
    """``a`` opens, ``b`` accepts, the ACK reaches ``a``; return (a's handle, b's handle)."""
    ha = a.open_channel()
    [opened] = pump(a, b)
    assert isinstance(opened, ChannelOpened)
    b.accept_channel(opened.channel)
    assert pump(b, a) == [ChannelAccepted(ha)]
    return ha, opened.channel


def relay_raw(src: YamuxEngine, dst: YamuxEngine) -> tuple[bytes, list[Event]]:
    """Move ``src``'s pending output into ``dst``; return the bytes and ``dst``'s events."""
    raw = out(src)
    return raw, norm(dst.receive_data(raw))


def relay(src: YamuxEngine, dst: YamuxEngine) -> tuple[list[Frame], list[Event]]:
    """Like :func:`relay_raw`, with the bytes decoded into frames."""
    raw, events = relay_raw(src, dst)
    return decoded(raw), events


def fill(engine: YamuxEngine, handle: int, n: int | None = None) -> int:
    """Send ``n`` bytes (default: all the credit); return how many."""
    n = engine.send_credit(handle) if n is None else n
    engine.send_data(handle, bytes(n))
    return n


def set_rtt(engine: YamuxEngine, peer: YamuxEngine, start: float, rtt: float) -> None:
    """A ping round trip from ``engine`` (sent at ``start``, answered at ``start + rtt``)."""
    engine.now = start
    opaque = engine.ping()
    assert pump(engine, peer) == []
    engine.now = start + rtt
    assert pump(peer, engine) == [PingAcked(opaque)]
    assert engine.rtt == pytest.approx(rtt)


def assert_protocol_error(engine: YamuxEngine, raw: bytes, *needles: str) -> ProtocolError:
    """Feed ``raw``; expect a ProtocolError naming yamux and every needle (regexes), and a
    GoAway(protocol error) queued."""
    with pytest.raises(ProtocolError) as info:
        engine.receive_data(raw)
    err = info.value
    assert err.format == "yamux"
    text = str(err)
    assert text.startswith("yamux: ")
    for needle in needles:
        assert re.search(needle, text), (needle, text)
    assert engine.closed
    assert out(engine) == GOAWAY_PROTOCOL
    # a closed engine refuses further input, again naming the format
    with pytest.raises(ProtocolError, match="^yamux: .*after the session ended"):
        engine.receive_data(hdr(T.PING, F.SYN, 0, 1))
    return err


# -- construction ------------------------------------------------------------------------


def test_engine_properties() -> None:
    engine = YamuxEngine()
    assert engine.format == "yamux"
    assert engine.ready
    assert engine.can_open
    assert engine.has_flow_control is True
    assert engine.needs_acceptance is False
    assert engine.max_frame == 64 * KIB  # SessionConfig.send_frame
    assert engine.is_client
    assert engine.rtt is None
    assert engine.now == 0.0
    assert not engine.local_goaway and engine.remote_goaway is None
    assert engine.channel_count == 0
    assert not engine.closed and not engine.has_output
    assert YamuxEngine(SessionConfig(send_frame=100), is_client=False).max_frame == 100
    made = make_engine("yamux", is_client=False)
    assert isinstance(made, YamuxEngine) and not made.is_client


# -- opening -----------------------------------------------------------------------------


def test_client_opens_odd_ids_server_even_ids() -> None:
    a, b = pair()
    for sid in (1, 3, 5):
        handle = a.open_channel()
        assert out(a) == h(wu(sid, F.SYN))  # WindowUpdate + SYN, delta 0
        assert a.channel_name(handle) == str(sid)
    for sid in (2, 4):
        handle = b.open_channel("named")
        assert out(b) == h(wu(sid, F.SYN))
        assert b.channel_name(handle) == "named"  # names are local: not on the wire
    assert out(a) == b""
    a.open_channel()
    assert out(a) == h("00 01 0001 00000007 00000000")


def test_open_accept_and_ack() -> None:
    a, b = pair()
    ha = a.open_channel()
    assert out(a) == h("00 01 0001 00000001 00000000")
    assert a.send_credit(ha) == WINDOW  # usable at once
    assert a.is_live(ha)
    [opened] = b.receive_data(h("00 01 0001 00000001 00000000"))
    assert opened == ChannelOpened(opened.channel, "1")
    hb = opened.channel
    assert b.send_credit(hb) == 0  # not accepted yet
    b.accept_channel(hb)
    assert out(b) == h("00 01 0002 00000001 00000000")  # WindowUpdate + ACK
    assert b.send_credit(hb) == WINDOW
    with pytest.raises(RuntimeError, match="yamux"):
        b.accept_channel(hb)  # twice
    with pytest.raises(RuntimeError, match="yamux"):
        a.accept_channel(ha)  # our own stream
    assert a.receive_data(h("00 01 0002 00000001 00000000")) == [ChannelAccepted(ha)]
    # a second ACK is no second acceptance
    assert a.receive_data(h("00 01 0002 00000001 00000000")) == []
    assert out(a) == b"" and out(b) == b""


def test_server_opens_and_client_accepts() -> None:
    a, b = pair()
    hb, ha = open_stream(b, a)
    assert b.describe(hb).startswith("channel 2 (local")
    assert a.describe(ha).startswith("channel 2 (remote")


def test_data_before_the_ack_is_delivered() -> None:
    a, b = pair()
    ha = a.open_channel()
    a.send_data(ha, b"early")
    assert out(a) == h(wu(1, F.SYN)) + h("00 00 0000 00000001 00000005") + b"early"
    a.send_data(ha, b"more")
    events = b.receive_data(h(wu(1, F.SYN)) + data(1, b"early"))
    hb = events[0].channel  # type: ignore[attr-defined]
    assert norm(events) == [ChannelOpened(hb, "1"), DataReceived(hb, b"early", 5)]
    # before accepting, more data still counts
    assert pump(a, b) == [DataReceived(hb, b"more", 4)]
    b.accept_channel(hb)
    b.send_data(hb, b"reply")
    assert pump(b, a) == [ChannelAccepted(ha), DataReceived(ha, b"reply", 5)]


def test_syn_and_ack_riding_on_data_frames() -> None:
    a = YamuxEngine()
    ha = a.open_channel()
    out(a)
    # the peer opens stream 2 with data, and acknowledges ours with data
    events = norm(a.receive_data(data(2, b"syn!", F.SYN) + data(1, b"ack!", F.ACK)))
    hb = events[0].channel  # type: ignore[attr-defined]
    assert events == [
        ChannelOpened(hb, "2"),
        DataReceived(hb, b"syn!", 4),
        ChannelAccepted(ha),
        DataReceived(ha, b"ack!", 4),
    ]


def test_large_writes_are_split_into_max_frame_frames() -> None:
    a, b = pair(send_frame=1000)
    ha, _hb = open_stream(a, b)
    payload = bytes(range(250)) * 10  # 2500 bytes
    a.send_data(ha, payload)
    raw = out(a)
    assert [(f.type, f.stream_id, f.length) for f in decoded(raw)] == [
        (0, 1, 1000),
        (0, 1, 1000),
        (0, 1, 500),
    ]
    [event] = b.receive_data(raw)
    assert isinstance(event, DataReceived)
    assert event.flow_controlled_length == 2500
    assert len(event.more) == 2  # consecutive frames of one stream: one event
    assert bytes(event.data) + b"".join(bytes(m) for m in event.more) == payload
    a.send_data(ha, b"")  # nothing to send
    assert out(a) == b""


def test_consecutive_frames_of_different_streams_are_separate_events() -> None:
    a, b = pair()
    h1, b1 = open_stream(a, b)
    h3, b3 = open_stream(a, b)
    for handle, chunk in ((h1, b"a"), (h1, b"b"), (h3, b"c"), (h1, b"d")):
        a.send_data(handle, chunk)
    assert pump(a, b) == [DataReceived(b1, b"ab", 2), DataReceived(b3, b"c", 1), DataReceived(b1, b"d", 1)]


# -- flow control ------------------------------------------------------------------------


def test_credit_starts_at_256_kib_and_a_receiver_that_never_acks_stops_the_sender() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    assert a.send_credit(ha) == WINDOW
    assert b.send_credit(hb) == WINDOW
    a.send_data(ha, bytes(100_000))
    assert a.send_credit(ha) == WINDOW - 100_000
    a.send_data(ha, bytes(WINDOW - 100_000))
    assert a.send_credit(ha) == 0
    with pytest.raises(ValueError, match="credit"):
        a.send_data(ha, b"x")  # sending past the window is a local bug
    events = pump(a, b)
    assert sum(e.flow_controlled_length for e in events if isinstance(e, DataReceived)) == WINDOW
    assert out(b) == b""  # nothing consumed: no credit returned
    assert a.send_credit(ha) == 0


def test_ack_below_half_sends_nothing_at_half_one_window_update() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    fill(a, ha)
    pump(a, b)
    b.ack_consumed(hb, HALF - 1)
    assert out(b) == b""
    b.ack_consumed(hb, 0)
    assert out(b) == b""
    b.ack_consumed(hb, 1)
    assert relay_raw(b, a) == (h("00 01 0000 00000001 00020000"), [CreditAvailable(ha)])  # delta 131072
    assert a.send_credit(ha) == HALF
    # the next update again needs half a window
    b.ack_consumed(hb, HALF - 1)
    assert out(b) == b""
    b.ack_consumed(hb, 5)  # only what was received counts
    assert relay_raw(b, a) == (h(wu(1, 0, HALF)), [])  # not blocked: no event
    assert a.send_credit(ha) == WINDOW


def test_one_big_ack_sends_one_update() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    fill(a, ha)
    pump(a, b)
    b.ack_consumed(hb, WINDOW)
    assert out(b) == h(wu(1, 0, WINDOW))
    b.ack_consumed(hb, 100)  # nothing outstanding
    assert out(b) == b""


def test_credit_available_only_when_the_sender_was_blocked() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    fill(a, ha, 10)
    assert b.receive_data(h(wu(1, 0, 100))) == []  # a was not blocked: no event
    assert a.receive_data(h(wu(1, 0, 100))) == []
    assert a.send_credit(ha) == WINDOW - 10 + 100
    fill(a, ha)
    assert a.send_credit(ha) == 0
    assert a.receive_data(h(wu(1, 0, 0))) == []  # delta 0: still blocked
    assert a.receive_data(h(wu(1, 0, 7))) == [CreditAvailable(ha)]
    assert a.send_credit(ha) == 7
    assert b.is_live(hb)


def test_window_update_with_flags_carries_credit_too() -> None:
    a = YamuxEngine()
    ha = a.open_channel()
    fill(a, ha)  # the whole window, before the ACK
    assert a.receive_data(h(wu(1, F.ACK, 500))) == [ChannelAccepted(ha), CreditAvailable(ha)]
    assert a.send_credit(ha) == 500


def test_no_credit_is_returned_after_the_peer_finished() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    fill(a, ha)
    pump(a, b)
    assert a.end_channel(ha) is False
    assert a.send_credit(ha) == 0  # we ended: nothing more to send
    assert pump(a, b) == [ChannelEnded(hb)]
    b.ack_consumed(hb, WINDOW)
    assert out(b) == b""  # the peer finished: credit would be pointless


@pytest.mark.parametrize("end", ["fin", "rst"])
def test_credit_due_is_dropped_when_the_peer_ends_the_stream_before_it_is_sent(end: str) -> None:
    """The application consumed (credit is due) but the output was not taken yet (a full
    socket); then the peer's FIN (we had sent ours: the stream is closed both ways) or RST
    arrives. hashicorp/yamux would log "frame for missing stream" for the update."""
    a, b = pair()
    ha, hb = open_stream(a, b)
    fill(b, hb)
    pump(b, a)
    assert a.end_channel(ha) is False
    pump(a, b)  # our FIN went out
    a.ack_consumed(ha, WINDOW)
    assert a.has_output  # the update is due
    a.receive_data(h(wu(1, F.FIN if end == "fin" else F.RST)))
    assert not a.is_live(ha)
    assert out(a) == b""  # no update for a stream the peer has closed


def test_credit_due_for_a_stream_only_half_closed_by_us_still_goes_out() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    fill(b, hb)
    pump(b, a)
    assert a.end_channel(ha) is False
    pump(a, b)
    a.ack_consumed(ha, WINDOW)
    assert relay_raw(a, b) == (h(wu(1, 0, WINDOW)), [CreditAvailable(hb)])  # the peer still sends


def test_credit_due_goes_out_as_one_update_per_stream() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    fill(b, hb)
    pump(b, a)
    a.ack_consumed(ha, HALF)
    a.ack_consumed(ha, HALF)  # before the output was taken
    assert out(a) == h(wu(1, 0, WINDOW))


@pytest.mark.parametrize("split", [False, True])
def test_overrun_is_a_flow_control_error_and_goaway(split: bool) -> None:
    b = YamuxEngine(is_client=False)
    [opened] = b.receive_data(h(wu(1, F.SYN)))
    assert isinstance(opened, ChannelOpened)
    b.accept_channel(opened.channel)
    out(b)
    if split:
        b.receive_data(data(1, bytes(WINDOW)))
        raw = data(1, b"x")
    else:
        raw = data(1, bytes(WINDOW + 1))  # one frame, within max_data, past the window
    with pytest.raises(FlowControlError) as info:
        b.receive_data(raw)
    assert isinstance(info.value, ProtocolError)
    assert info.value.format == "yamux"
    text = str(info.value)
    assert text.startswith("yamux: channel 1 ")
    assert "overran" in text and str(WINDOW) in text
    assert b.closed
    assert out(b) == GOAWAY_PROTOCOL == h("00 03 0000 00000000 00000001")


def test_overrun_on_a_flagged_data_frame() -> None:
    b = YamuxEngine(is_client=False)
    b.receive_data(h(wu(1, F.SYN)))
    out(b)
    with pytest.raises(FlowControlError, match="channel 1"):
        b.receive_data(data(1, bytes(WINDOW + 1), F.FIN))
    assert out(b) == GOAWAY_PROTOCOL


def test_overrun_counts_returned_credit() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    fill(a, ha)
    pump(a, b)
    b.ack_consumed(hb, HALF)
    out(b)  # the update is lost in transit: it does not matter, the peer may send HALF more
    b.receive_data(data(1, bytes(HALF)))
    with pytest.raises(FlowControlError):
        b.receive_data(data(1, b"y"))
    assert out(b) == GOAWAY_PROTOCOL


def test_data_frame_above_max_data_is_a_protocol_error() -> None:
    b = YamuxEngine(SessionConfig(max_receive_window=MIB), is_client=False)
    b.receive_data(h(wu(1, F.SYN)))
    out(b)
    assert_protocol_error(b, hdr(T.DATA, 0, 1, MIB + 1), f"{MIB + 1} bytes", "stream 1")


# -- auto-tuning -------------------------------------------------------------------------


def tuned_stream(**config: int) -> tuple[YamuxEngine, YamuxEngine, int, int]:
    """The server ``b`` measures rtt 0.01 (by time 0.01); then ``a`` opens a stream to it."""
    a, b = pair(**config)
    set_rtt(b, a, 0.0, 0.01)
    ha, hb = open_stream(a, b)
    return a, b, ha, hb


def update(b: YamuxEngine, a: YamuxEngine, ha: int, sid: int = 1) -> int:
    """Relay ``b``'s single WindowUpdate for ``sid`` to ``a`` (blocked: CreditAvailable);
    return its delta."""
    frames, events = relay(b, a)
    [frame] = frames
    assert frame == Frame(T.WINDOW_UPDATE, 0, sid, frame.length), frame
    assert events == [CreditAvailable(ha)]
    assert a.send_credit(ha) == frame.length
    return frame.length


def test_fast_reader_doubles_the_window_up_to_the_maximum() -> None:
    a, b, ha, hb = tuned_stream(max_receive_window=MIB)
    window = WINDOW
    deltas = []
    for step in range(1, 7):
        fill(a, ha)  # the sender uses all its credit: the whole window is outstanding
        pump(a, b)
        b.now = 0.01 + step * 0.01  # one rtt after the last update: within 4 x rtt
        b.ack_consumed(hb, window // 2 - 1)
        assert out(b) == b""  # the threshold is half the current window
        b.ack_consumed(hb, 1)
        delta = update(b, a, ha)
        deltas.append(delta)
        if window < MIB:
            assert delta == window // 2 + window  # credit + growth: the window doubles
            window *= 2
        else:
            assert delta == window // 2  # at the maximum: credit only
    assert deltas == [HALF + WINDOW, WINDOW + 2 * WINDOW] + [MIB // 2] * 4
    assert b._grown == MIB - WINDOW


def test_fast_reader_sequence_spelled_out() -> None:
    a, b, ha, hb = tuned_stream(max_receive_window=MIB)
    fill(a, ha)
    pump(a, b)
    b.now = 0.02
    b.ack_consumed(hb, HALF)
    raw, events = relay_raw(b, a)
    assert raw == h(wu(1, 0, 3 * HALF))  # 128 KiB credit + 256 KiB growth = 384 KiB
    assert events == [CreditAvailable(ha)]
    assert fill(a, ha) == 384 * KIB  # window 512 KiB, 128 KiB of it outstanding
    pump(a, b)
    b.now = 0.03
    b.ack_consumed(hb, HALF)  # the threshold is now 256 KiB
    assert out(b) == b""
    b.ack_consumed(hb, HALF)
    raw, _ = relay_raw(b, a)
    assert raw == h(wu(1, 0, 768 * KIB))  # 256 KiB + 512 KiB growth: window 1 MiB
    assert fill(a, ha) == 768 * KIB
    pump(a, b)
    b.now = 0.04
    b.ack_consumed(hb, 512 * KIB)
    raw, _ = relay_raw(b, a)
    assert raw == h(wu(1, 0, 512 * KIB))  # at the maximum: no growth
    assert fill(a, ha) == 512 * KIB
    pump(a, b)
    b.now = 0.05
    b.ack_consumed(hb, 512 * KIB)
    assert out(b) == h(wu(1, 0, 512 * KIB))
    assert b._grown == 768 * KIB


def test_slow_reader_does_not_grow_the_window() -> None:
    a, b, ha, hb = tuned_stream(max_receive_window=MIB)
    for step in range(1, 5):
        fill(a, ha)
        pump(a, b)
        b.now = 0.01 + step * 0.05  # more than 4 x rtt since the last update
        b.ack_consumed(hb, HALF)
        assert update(b, a, ha) == HALF
    assert b._grown == 0


def test_no_rtt_no_growth() -> None:
    a, b = pair(max_receive_window=MIB)
    ha, hb = open_stream(a, b)
    fill(a, ha)
    pump(a, b)
    b.ack_consumed(hb, HALF)  # no time passed at all, but no rtt was measured
    assert update(b, a, ha) == HALF
    assert b.rtt is None


def test_growth_boundary_is_four_rtts() -> None:
    a, b = pair(max_receive_window=MIB)
    set_rtt(b, a, 0.0, 0.25)  # exact binary fractions: 4 x rtt = 1.0
    ha, hb = open_stream(a, b)  # the stream's epoch: 0.25
    fill(a, ha)
    pump(a, b)
    b.now = 1.25  # exactly 4 x rtt later: not within
    b.ack_consumed(hb, HALF)
    assert update(b, a, ha) == HALF
    fill(a, ha)
    pump(a, b)
    b.now = 2.2421875  # just under 4 x rtt after 1.25
    b.ack_consumed(hb, HALF)
    assert update(b, a, ha) == HALF + WINDOW


def test_max_receive_window_at_the_initial_window_never_grows() -> None:
    a, b, ha, hb = tuned_stream(max_receive_window=WINDOW)
    fill(a, ha)
    pump(a, b)
    b.now = 0.02
    b.ack_consumed(hb, HALF)
    assert update(b, a, ha) == HALF
    assert b._grown == 0


def test_growth_is_capped_at_the_maximum_not_only_doubled() -> None:
    a, b, ha, hb = tuned_stream(max_receive_window=400 * KIB)
    fill(a, ha)
    pump(a, b)
    b.now = 0.02
    b.ack_consumed(hb, HALF)
    assert update(b, a, ha) == HALF + 144 * KIB  # 256 -> 400 KiB
    assert b._grown == 144 * KIB


def budget_streams() -> tuple[YamuxEngine, YamuxEngine, tuple[int, int], tuple[int, int]]:
    """Budget 300 KiB, two fast streams (1 and 3): stream 1 grows by 256 KiB, stream 3 gets
    the remaining 44 KiB."""
    a, b = pair(max_receive_window=MIB, window_budget=300 * KIB)
    set_rtt(b, a, 0.0, 0.01)
    h1, b1 = open_stream(a, b)
    h3, b3 = open_stream(a, b)
    fill(a, h1)
    fill(a, h3)
    pump(a, b)
    b.now = 0.02
    b.ack_consumed(b1, HALF)
    assert b._grown == WINDOW
    b.ack_consumed(b3, HALF)
    assert b._grown == 300 * KIB
    frames, events = relay(b, a)
    assert frames == [
        Frame(T.WINDOW_UPDATE, 0, 1, HALF + WINDOW),  # stream 1 doubles
        Frame(T.WINDOW_UPDATE, 0, 3, HALF + 44 * KIB),  # stream 3 gets what is left
    ]
    assert events == [CreditAvailable(h1), CreditAvailable(h3)]
    return a, b, (h1, b1), (h3, b3)


def test_window_budget_caps_growth_across_streams() -> None:
    a, b, (h1, b1), (h3, b3) = budget_streams()
    fill(a, h1)
    fill(a, h3)
    pump(a, b)
    b.now = 0.03
    b.ack_consumed(b1, WINDOW)  # stream 1 (window 512 KiB) keeps up, but the budget is spent
    b.ack_consumed(b3, 150 * KIB)  # stream 3 (window 300 KiB) too
    frames, _ = relay(b, a)
    assert frames == [Frame(T.WINDOW_UPDATE, 0, 1, WINDOW), Frame(T.WINDOW_UPDATE, 0, 3, 150 * KIB)]
    assert b._grown == 300 * KIB


@pytest.mark.parametrize("how", ["local-reset", "peer-reset", "fin-both-ways", "peer-fin-last"])
def test_growth_returns_to_the_budget_when_a_stream_closes(how: str) -> None:
    a, b, (h1, b1), (h3, b3) = budget_streams()
    if how == "local-reset":
        b.reset_channel(b1)
    elif how == "peer-reset":
        a.reset_channel(h1)
        assert pump(a, b) == [ChannelReset(b1, None)]
    elif how == "fin-both-ways":
        a.end_channel(h1)
        assert pump(a, b) == [ChannelEnded(b1)]
        assert b.end_channel(b1) is True
    else:
        b.end_channel(b1)
        a.end_channel(h1)
        assert pump(a, b) == [ChannelEnded(b1), ChannelClosed(b1)]
    assert not b.is_live(b1)
    assert b._grown == 44 * KIB  # stream 1's growth is back in the budget
    out(b)
    # stream 3 (window 300 KiB) may grow again, into the returned budget
    fill(a, h3)
    pump(a, b)
    b.now = 0.025
    b.ack_consumed(b3, 150 * KIB)
    # credit 150 KiB + growth 256 KiB (not the full 300 KiB: only 256 KiB of budget is free)
    assert update(b, a, h3, sid=3) == 150 * KIB + WINDOW
    assert b._grown == 300 * KIB
    b.reset_channel(b3)
    assert b._grown == 0


def test_auto_tuning_with_an_integer_clock() -> None:
    a, b = pair(max_receive_window=MIB)
    b.now = 0
    opaque = b.ping()
    pump(b, a)
    b.now = 1
    assert pump(a, b) == [PingAcked(opaque)]
    assert b.rtt == 1
    ha, hb = open_stream(a, b)
    fill(a, ha)
    pump(a, b)
    b.now = 2  # one rtt later: a fast reader
    b.ack_consumed(hb, HALF)
    assert update(b, a, ha) == HALF + WINDOW  # actual: HALF


# -- half-close and reset ----------------------------------------------------------------


def test_fin_each_way_then_closed_and_forgotten() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    assert a.end_channel(ha) is False
    assert out(a) == h(wu(1, F.FIN))
    assert a.end_channel(ha) is False  # twice: nothing more
    assert out(a) == b""
    assert a.send_credit(ha) == 0
    with pytest.raises(RuntimeError, match="yamux"):
        a.send_data(ha, b"late")
    assert b.receive_data(h(wu(1, F.FIN))) == [ChannelEnded(hb)]
    # the other direction still works
    b.send_data(hb, b"still")
    assert pump(b, a) == [DataReceived(ha, b"still", 5)]
    assert a.is_live(ha) and b.is_live(hb)
    assert b.end_channel(hb) is True  # the peer had ended: gone
    assert not b.is_live(hb)
    assert out(b) == h(wu(1, F.FIN))
    assert a.receive_data(h(wu(1, F.FIN))) == [ChannelEnded(ha), ChannelClosed(ha)]
    assert not a.is_live(ha)
    assert a.channel_count == b.channel_count == 0


def test_fin_on_a_data_frame() -> None:
    a, b = pair()
    _ha, hb = open_stream(a, b)
    events = norm(b.receive_data(data(1, b"last", F.FIN) + h(wu(1, F.FIN))))
    # data first, then the end; a repeated FIN is ignored
    assert events == [DataReceived(hb, b"last", 4), ChannelEnded(hb)]
    assert b.is_live(hb)
    assert out(b) == b""


def test_fins_crossing() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    a.end_channel(ha)
    b.end_channel(hb)
    assert pump(a, b) == [ChannelEnded(hb), ChannelClosed(hb)]
    assert pump(b, a) == [ChannelEnded(ha), ChannelClosed(ha)]
    assert a.channel_count == b.channel_count == 0


def test_rst_resets() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    a.reset_channel(ha, "ignored: yamux carries no message")
    assert out(a) == h(wu(1, F.RST))
    assert not a.is_live(ha)
    a.reset_channel(ha)  # unknown now: nothing
    assert out(a) == b""
    assert b.receive_data(h(wu(1, F.RST))) == [ChannelReset(hb, None)]
    assert not b.is_live(hb)
    assert b.send_credit(hb) == 0


def test_rst_on_a_data_frame_delivers_the_data_first() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    assert norm(b.receive_data(data(1, b"bye", F.RST))) == [DataReceived(hb, b"bye", 3), ChannelReset(hb)]
    assert a.is_live(ha)


def test_reject_sends_rst() -> None:
    a, b = pair()
    ha = a.open_channel()
    [opened] = pump(a, b)
    assert isinstance(opened, ChannelOpened)
    b.reject_channel(opened.channel)
    assert out(b) == h("00 01 0008 00000001 00000000")
    assert not b.is_live(opened.channel)
    assert a.receive_data(h(wu(1, F.RST))) == [ChannelReset(ha, None)]
    assert a.channel_count == 0


# -- ping --------------------------------------------------------------------------------


def test_ping_syn_is_answered_with_the_same_opaque() -> None:
    b = YamuxEngine(is_client=False)
    assert b.receive_data(h("00 02 0001 00000000 deadbeef")) == []
    assert out(b) == h("00 02 0002 00000000 deadbeef")
    assert b.receive_data(hdr(T.PING, F.SYN, 0, 0) + hdr(T.PING, F.SYN, 0, 2**32 - 1)) == []
    assert out(b) == hdr(T.PING, F.ACK, 0, 0) + hdr(T.PING, F.ACK, 0, 2**32 - 1)


def test_our_ping_ack_gives_ping_acked_and_rtt() -> None:
    a, b = pair()
    a.now = 100.0
    first = a.ping()
    assert out(a) == h(f"00 02 0001 00000000 {first:08x}")
    a.now = 100.5
    second = a.ping()
    assert second != first
    assert out(a) == h(f"00 02 0001 00000000 {second:08x}")
    raw = h(f"00 02 0001 00000000 {first:08x}") + h(f"00 02 0001 00000000 {second:08x}")
    assert b.receive_data(raw) == []
    assert out(b) == h(f"00 02 0002 00000000 {first:08x} 00 02 0002 00000000 {second:08x}")
    a.now = 101.25
    assert a.receive_data(h(f"00 02 0002 00000000 {second:08x}")) == [PingAcked(second)]
    assert a.rtt == pytest.approx(0.75)
    a.now = 102.0
    assert a.receive_data(h(f"00 02 0002 00000000 {first:08x}")) == [PingAcked(first)]
    assert a.rtt == pytest.approx(2.0)
    assert out(a) == b""


def test_pump_ping_round_trip() -> None:
    a, b = pair()
    set_rtt(a, b, 5.0, 0.01)
    set_rtt(b, a, 7.0, 0.5)
    assert a.rtt == pytest.approx(0.01)


def test_unrequested_ping_ack_is_a_protocol_error() -> None:
    a, _b = pair()
    assert_protocol_error(a, h("00 02 0002 00000000 0000002a"), "ping", r"\b42\b")


def test_ping_ack_is_accepted_once() -> None:
    a, _b = pair()
    opaque = a.ping()
    out(a)
    assert a.receive_data(hdr(T.PING, F.ACK, 0, opaque)) == [PingAcked(opaque)]
    assert_protocol_error(a, hdr(T.PING, F.ACK, 0, opaque), "ping", str(opaque))


# -- GoAway ------------------------------------------------------------------------------


def test_close_sends_goaway_once_and_refuses_new_streams() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    b.close()
    assert out(b) == h("00 03 0000 00000000 00000000")
    b.close()
    assert out(b) == b""
    assert b.local_goaway and not b.can_open
    assert not b.closed  # received data is still processed
    with pytest.raises(RuntimeError, match="yamux.*GoAway"):
        b.open_channel()
    assert b.channel_count == 1
    # an incoming SYN is answered with RST, no event
    assert b.receive_data(h(wu(3, F.SYN)) + data(5, b"x", F.SYN)) == []
    assert out(b) == h(wu(3, F.RST)) + h(wu(5, F.RST))
    assert b.channel_count == 1
    # the open stream still works
    a.send_data(ha, b"ping")
    assert pump(a, b) == [DataReceived(hb, b"ping", 4)]
    b.send_data(hb, b"pong")
    assert pump(b, a) == [DataReceived(ha, b"pong", 4)]


def test_receiving_goaway() -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    b.close()
    assert pump(b, a) == [SessionClosed(0, "code 0: normal")]
    assert a.remote_goaway == 0
    assert not a.can_open
    assert not a.local_goaway
    with pytest.raises(RuntimeError, match=r"yamux: .*peer sent GoAway \(code 0: normal\)"):
        a.open_channel()
    # a second GoAway is no second event
    assert a.receive_data(GOAWAY_PROTOCOL) == []
    assert a.remote_goaway == 0
    # open streams go on: data and FIN both ways
    a.send_data(ha, b"after")
    a.end_channel(ha)
    assert pump(a, b) == [DataReceived(hb, b"after", 5), ChannelEnded(hb)]
    b.send_data(hb, b"reply")
    assert b.end_channel(hb) is True
    assert pump(b, a) == [DataReceived(ha, b"reply", 5), ChannelEnded(ha), ChannelClosed(ha)]
    assert a.channel_count == b.channel_count == 0
    assert out(a) == b""


@pytest.mark.parametrize(
    ("code", "message"),
    [(1, "code 1: protocol error"), (2, "code 2: internal error"), (7, "code 7: unknown")],
)
def test_receiving_goaway_codes(code: int, message: str) -> None:
    a = YamuxEngine()
    assert a.receive_data(hdr(T.GO_AWAY, 0, 0, code)) == [SessionClosed(code, message)]
    assert a.remote_goaway == code
    assert not a.can_open
    with pytest.raises(RuntimeError, match=re.escape(message)):
        a.open_channel()
    assert not a.closed


def test_a_stream_opened_after_the_peers_goaway_is_refused() -> None:
    """The peer said it is going away: a stream it opens after that is reset (not
    opened), and the session goes on."""
    a = YamuxEngine()
    a.receive_data(GOAWAY_NORMAL)
    assert a.receive_data(data(2, b"hi", F.SYN)) == []
    assert out(a) == h(wu(2, F.RST))
    assert not a.closed and a.channel_count == 0


# -- documented ignores ------------------------------------------------------------------


IGNORED_FRAMES = {
    "data": lambda sid: data(sid, b"lost"),
    "empty-data": lambda sid: data(sid, b""),
    "window-update": lambda sid: h(wu(sid, 0, 1000)),
    "ack": lambda sid: h(wu(sid, F.ACK)),
    "fin": lambda sid: h(wu(sid, F.FIN)),
    "rst": lambda sid: h(wu(sid, F.RST)),
    "data-fin": lambda sid: data(sid, b"x", F.FIN),
    "data-rst": lambda sid: data(sid, b"x", F.RST),
}


@pytest.mark.parametrize("kind", list(IGNORED_FRAMES))
@pytest.mark.parametrize("sid", [1, 2, 9, 2**32 - 1])
def test_frames_for_unknown_streams_are_dropped(kind: str, sid: int) -> None:
    b = YamuxEngine(is_client=False)
    raw = IGNORED_FRAMES[kind](sid)
    assert b.receive_data(raw) == []
    assert out(b) == b""
    assert not b.closed and b.channel_count == 0


@pytest.mark.parametrize("kind", list(IGNORED_FRAMES))
@pytest.mark.parametrize("how", ["closed", "reset-by-us", "reset-by-peer", "rejected"])
def test_frames_for_closed_streams_are_dropped(kind: str, how: str) -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    if how == "closed":
        a.end_channel(ha)
        pump(a, b)
        b.end_channel(hb)
        pump(b, a)
    elif how == "reset-by-us":
        b.reset_channel(hb)
    elif how == "reset-by-peer":
        a.reset_channel(ha)
        pump(a, b)
    else:
        ha = a.open_channel()
        [opened] = pump(a, b)
        b.reject_channel(opened.channel)  # type: ignore[attr-defined]
        hb = opened.channel  # type: ignore[attr-defined]
    out(b)
    assert not b.is_live(hb)
    sid = 3 if how == "rejected" else 1
    assert b.receive_data(IGNORED_FRAMES[kind](sid)) == []
    assert out(b) == b""
    assert not b.closed


def test_ignored_frames_between_data_frames() -> None:
    a, b = pair()
    _ha, hb = open_stream(a, b)
    raw = data(1, b"a") + data(9, b"zz") + data(1, b"b") + h(wu(1, 0, 5)) + data(1, b"c")
    events = norm(b.receive_data(raw))
    assert events == [DataReceived(hb, b"a", 1), DataReceived(hb, b"b", 1), DataReceived(hb, b"c", 1)]
    assert out(b) == b""


# -- protocol errors ---------------------------------------------------------------------


def test_syn_for_an_id_in_use() -> None:
    b = YamuxEngine(is_client=False)
    b.receive_data(h(wu(3, F.SYN)))
    out(b)
    assert_protocol_error(b, h(wu(3, F.SYN)), r"SYN for stream 3\b", "already open")


def test_syn_for_our_own_open_stream() -> None:
    a = YamuxEngine()
    a.open_channel()
    out(a)
    assert_protocol_error(a, data(1, b"x", F.SYN), r"stream 1\b")


@pytest.mark.parametrize(("is_client", "sid"), [(True, 1), (True, 7), (False, 2), (False, 2**32 - 2)])
def test_syn_with_our_parity(is_client: bool, sid: int) -> None:
    engine = YamuxEngine(is_client=is_client)
    assert_protocol_error(engine, h(wu(sid, F.SYN)), rf"SYN for stream {sid}\b", "parity")


@pytest.mark.parametrize(
    "raw",
    [
        data(0, b"x"),
        data(0, b""),
        data(0, b"x", F.SYN),
        h(wu(0, 0, 100)),
        h(wu(0, F.SYN)),
        h(wu(0, F.RST)),
    ],
    ids=["data", "empty-data", "data-syn", "window-update", "wu-syn", "wu-rst"],
)
def test_stream_frame_on_stream_0(raw: bytes) -> None:
    assert_protocol_error(YamuxEngine(is_client=False), raw, r"stream 0\b")


def test_data_after_fin() -> None:
    a, b = pair()
    _ha, hb = open_stream(a, b)
    assert b.receive_data(h(wu(1, F.FIN))) == [ChannelEnded(hb)]
    out(b)
    assert_protocol_error(b, data(1, b"late"), r"stream 1\b", "after its FIN")


def test_data_after_fin_with_flags() -> None:
    a, b = pair()
    _ha, hb = open_stream(a, b)
    assert norm(b.receive_data(data(1, b"x", F.FIN))) == [DataReceived(hb, b"x", 1), ChannelEnded(hb)]
    out(b)
    assert_protocol_error(b, data(1, b"late", F.ACK), r"stream 1\b", "after its FIN")


def test_protocol_error_after_good_frames_in_one_read() -> None:
    a, b = pair()
    open_stream(a, b)
    assert_protocol_error(b, data(1, b"fine") + data(0, b"bad"), r"stream 0\b")


def test_decoder_errors_end_the_session_with_goaway() -> None:
    assert_protocol_error(YamuxEngine(), h("01 00 0000 00000001 00000000"), "version is 1")
    assert_protocol_error(YamuxEngine(), h("00 04 0000 00000001 00000000"), "unknown type 4")
    assert_protocol_error(YamuxEngine(), h("00 ff 0000 00000001 00000000"), "unknown type 255")


def test_receive_eof_with_a_partial_frame() -> None:
    for partial in (b"\x00", hdr(T.WINDOW_UPDATE, 0, 1, 0)[:11], data(1, b"abc")[:14]):
        engine = YamuxEngine(is_client=False)
        engine.receive_data(h(wu(1, F.SYN)))
        assert engine.receive_data(partial) == []
        with pytest.raises(ProtocolError) as info:
            engine.receive_eof()
        assert info.value.format == "yamux"
        assert str(info.value).startswith("yamux: ")
        assert f"{len(partial)} bytes" in str(info.value)
        assert engine.closed


def test_receive_eof_inside_a_data_frame_names_the_stream() -> None:
    engine = YamuxEngine(is_client=False)
    engine.receive_data(h(wu(5, F.SYN)) + data(5, b"abc")[:14])
    with pytest.raises(ProtocolError, match=r"stream 5\b|channel 5\b"):
        engine.receive_eof()


def test_clean_eof() -> None:
    a, b = pair()
    open_stream(a, b)
    b.receive_eof()
    assert b.closed
    with pytest.raises(ProtocolError, match="^yamux: .*after the session ended"):
        b.receive_data(data(1, b"x"))


def test_stream_ids_exhausted() -> None:
    a = YamuxEngine()
    a._next_id = 2**32 - 1
    a.open_channel()
    assert out(a) == h(wu(2**32 - 1, F.SYN))
    with pytest.raises((RuntimeError, LimitExceeded)):
        a.open_channel()
    assert a.channel_count == 1


# -- property: arbitrary input -----------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    is_client=st.booleans(),
    chunks=st.lists(
        st.one_of(
            st.binary(max_size=14),
            st.builds(
                lambda t, f, i, n: hdr(t, f, i, n) + (bytes(n) if t == 0 else b""),
                st.integers(0, 3),
                st.integers(0, 15),
                st.integers(0, 6),
                st.integers(0, 20),
            ),
        ),
        max_size=12,
    ),
)
def test_arbitrary_input_never_raises_anything_but_protocol_error(
    is_client: bool, chunks: list[bytes]
) -> None:
    engine = YamuxEngine(is_client=is_client)
    engine.ping()
    try:
        for chunk in chunks:
            for event in engine.receive_data(chunk):
                if isinstance(event, ChannelOpened) and engine.is_live(event.channel):
                    engine.accept_channel(event.channel)
                elif isinstance(event, DataReceived) and engine.is_live(event.channel):
                    engine.ack_consumed(event.channel, event.flow_controlled_length)
            out(engine)
        engine.receive_eof()
    except ProtocolError as exc:
        assert exc.format == "yamux"
        assert engine.closed


# -- property: random interleavings conserve bytes ---------------------------------------

PATTERN = bytes(range(251)) * (MIB // 251 + 2)  # writes are slices of it


@dataclass
class Side:
    """The application on one end: what it wrote, read and has not acknowledged yet."""

    name: str
    engine: YamuxEngine
    handles: dict[str, int] = field(default_factory=dict)  # stream name (its id) -> handle
    names: dict[int, str] = field(default_factory=dict)
    written: dict[str, bytearray] = field(default_factory=dict)
    outbox: dict[str, bytearray] = field(default_factory=dict)  # written, not yet sent
    received: dict[str, bytearray] = field(default_factory=dict)
    unacked: dict[str, int] = field(default_factory=dict)  # received, not yet consumed
    want_end: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    pings: set[int] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)  # incoming streams we rejected

    def known(self) -> list[str]:
        return sorted(self.handles, key=int)

    def live(self) -> list[str]:
        return [n for n in self.known() if self.engine.is_live(self.handles[n])]

    def learn(self, name: str, handle: int) -> None:
        self.handles[name] = handle
        self.names[handle] = name
        self.written.setdefault(name, bytearray())
        self.outbox.setdefault(name, bytearray())
        self.received.setdefault(name, bytearray())
        self.unacked.setdefault(name, 0)


class World:
    def __init__(self, send_frame: int, reject: set[int], split: int, max_window: int) -> None:
        ea, eb = pair(send_frame=send_frame, max_receive_window=max_window, window_budget=max_window)
        self.a = Side("a", ea)
        self.b = Side("b", eb)
        self.reject = reject  # the k-th stream each side opens is rejected by the other
        self.split = split
        self.reset_names: set[str] = set()
        self.counter = 0
        self.opened = {"a": 0, "b": 0}
        self.reject_ids: set[str] = set()

    def other(self, side: Side) -> Side:
        return self.b if side is self.a else self.a

    def open(self, side: Side) -> None:
        handle = side.engine.open_channel()
        name = side.engine.channel_name(handle)
        if self.opened[side.name] in self.reject:
            self.reject_ids.add(name)
        self.opened[side.name] += 1
        side.learn(name, handle)

    def write(self, side: Side, idx: int, n: int) -> None:
        names = [c for c in side.live() if c not in side.want_end]
        if not names:
            return
        name = names[idx % len(names)]
        start = self.counter % 251
        self.counter += n
        chunk = PATTERN[start : start + n]
        side.written[name] += chunk
        side.outbox[name] += chunk

    def ack(self, side: Side, idx: int, n: int) -> None:
        names = [c for c in side.known() if side.unacked[c]]
        if not names:
            return
        name = names[idx % len(names)]
        k = min(n, side.unacked[name])
        side.unacked[name] -= k
        side.engine.ack_consumed(side.handles[name], k)

    def end(self, side: Side, idx: int) -> None:
        names = [c for c in side.live() if c not in side.want_end]
        if names:
            side.want_end.add(names[idx % len(names)])

    def reset(self, side: Side, idx: int) -> None:
        names = side.live()
        if not names:
            return
        name = names[idx % len(names)]
        self.reset_names.add(name)
        side.engine.reset_channel(side.handles[name])
        side.gone.add(name)

    def ping(self, side: Side) -> None:
        side.pings.add(side.engine.ping())

    def tick(self, dt: float) -> None:
        for side in (self.a, self.b):
            side.engine.now += dt

    def deliver(self, side: Side) -> bool:
        raw = out(side.engine)
        if not raw:
            return False
        self.tick(0.001)  # each delivery takes a millisecond: pings measure an rtt
        peer = self.other(side)
        # pieces of ``split`` bytes (at most 300 of them, to stay fast), then the rest at once
        cuts = [*range(0, min(len(raw), 300 * self.split), self.split), len(raw)]
        for start, stop in pairwise(cuts):
            for event in peer.engine.receive_data(raw[start:stop]):
                self.handle(peer, event)
        return True

    def handle(self, peer: Side, event: Event) -> None:
        engine = peer.engine
        assert not engine.closed
        if isinstance(event, PingAcked):
            peer.pings.remove(event.opaque)
            return
        if isinstance(event, ChannelOpened):
            peer.learn(event.name, event.channel)
            if not engine.is_live(event.channel):  # (a reset followed in the same read)
                return
            if event.name in self.reject_ids:
                self.reset_names.add(event.name)
                engine.reject_channel(event.channel)
                peer.gone.add(event.name)
                peer.refused.add(event.name)
            else:
                engine.accept_channel(event.channel)
            return
        name = peer.names[event.channel]  # type: ignore[attr-defined]
        if name in peer.refused:
            # events of the same read as the SYN, before we rejected the stream
            assert isinstance(event, DataReceived | ChannelEnded | ChannelReset), event
            return
        if isinstance(event, DataReceived):
            chunk = bytes(event.data) + b"".join(bytes(m) for m in event.more)
            assert event.flow_controlled_length == len(chunk) > 0
            peer.received[name] += chunk
            peer.unacked[name] += len(chunk)
        elif isinstance(event, ChannelAccepted):
            assert name not in peer.gone
        elif isinstance(event, CreditAvailable):
            assert engine.send_credit(event.channel) > 0 or not engine.is_live(event.channel)
        elif isinstance(event, ChannelEnded):
            assert name not in peer.gone
        elif isinstance(event, ChannelClosed):
            assert event.local_done and name in peer.ended
            peer.gone.add(name)
        elif isinstance(event, ChannelReset):
            assert event.message is None
            assert name in self.reset_names, (name, event)
            peer.gone.add(name)
        else:
            pytest.fail(f"unexpected event {event!r}")

    def flush(self, side: Side) -> bool:
        """Send what credit allows; end streams whose outbox emptied."""
        engine = side.engine
        progress = False
        for name in side.live():
            handle = side.handles[name]
            box = side.outbox[name]
            if box and name not in side.ended:
                k = min(len(box), engine.send_credit(handle))
                if k:
                    engine.send_data(handle, bytes(box[:k]))
                    del box[:k]
                    progress = True
            if name in side.want_end and not box and name not in side.ended:
                side.ended.add(name)
                if engine.end_channel(handle):
                    side.gone.add(name)
                assert engine.send_credit(handle) == 0
                progress = True
        return progress

    def settle(self) -> None:
        for side in (self.a, self.b):
            self.flush(side)

    def drain(self) -> None:
        """Read everything, end everything, run until quiet."""
        for _ in range(10_000):
            progress = False
            for side in (self.a, self.b):
                side.want_end.update(side.live())
                for name in side.known():
                    if side.unacked[name]:
                        side.engine.ack_consumed(side.handles[name], side.unacked[name])
                        side.unacked[name] = 0
                progress |= self.flush(side)
                progress |= self.deliver(side)
            if not progress:
                break
        else:
            raise AssertionError("did not settle")

    def check(self) -> None:
        a, b = self.a, self.b
        assert not a.engine.closed and not b.engine.closed
        for writer, reader in ((a, b), (b, a)):
            for name, written in writer.written.items():
                got = bytes(reader.received.get(name, b""))
                if name in self.reset_names:
                    assert bytes(written).startswith(got), name
                else:
                    assert got == bytes(written), name
                    assert not writer.outbox[name]
        assert a.engine.channel_count == 0
        assert b.engine.channel_count == 0
        assert not a.pings and not b.pings
        assert a.engine._grown == 0 and b.engine._grown == 0


SIDE = st.sampled_from(["a", "b"])
_OPEN = st.tuples(st.just("open"), SIDE)
_SIZE = st.one_of(st.integers(1, 700), st.integers(1, 700), st.integers(50_000, 300_000))
_WRITE = st.tuples(st.just("write"), SIDE, st.integers(0, 7), _SIZE)
_ACK = st.tuples(st.just("ack"), SIDE, st.integers(0, 7), st.one_of(st.integers(1, 1000), st.just(10**9)))
_END = st.tuples(st.just("end"), SIDE, st.integers(0, 7))
_RESET = st.tuples(st.just("reset"), SIDE, st.integers(0, 7))
_PUMP = st.tuples(st.just("pump"), SIDE)
_PING = st.tuples(st.just("ping"), SIDE)
_TICK = st.tuples(st.just("tick"), SIDE, st.sampled_from([0.001, 0.01, 0.5]))
COMMANDS = st.lists(
    st.one_of(_OPEN, _WRITE, _WRITE, _ACK, _ACK, _END, _RESET, _PUMP, _PUMP, _PUMP, _PING, _TICK),
    min_size=3,
    max_size=50,
).map(lambda cmds: [("open", "a"), ("open", "b"), ("write", "a", 0, 250), ("write", "b", 0, 250), *cmds])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    send_frame=st.sampled_from([1000, 16 * KIB, 64 * KIB]),
    reject=st.sets(st.integers(0, 6), max_size=2),
    split=st.sampled_from([7, 1000, 1 << 30]),
    max_window=st.sampled_from([WINDOW, MIB]),
    bulk=st.sampled_from([0, 0, 300 * KIB, MIB]),
    commands=COMMANDS,
)
def test_random_interleavings_conserve_bytes(
    send_frame: int,
    reject: set[int],
    split: int,
    max_window: int,
    bulk: int,
    commands: list[tuple[object, ...]],
) -> None:
    world = World(send_frame, reject, split, max_window)
    if bulk:  # a stream that needs several windows, pinged first so its window may grow
        bulk_commands = [("ping", "b"), ("pump", "b"), ("pump", "a"), ("write", "a", 0, bulk)]
        commands = [*commands[:4], *bulk_commands, *commands[4:]]  # (after the first opens)
    for command in commands:
        kind, side_name, *args = command
        side = world.a if side_name == "a" else world.b
        if kind == "open":
            world.open(side)
        elif kind == "write":
            world.write(side, *args)  # type: ignore[arg-type]
        elif kind == "ack":
            world.ack(side, *args)  # type: ignore[arg-type]
        elif kind == "end":
            world.end(side, *args)  # type: ignore[arg-type]
        elif kind == "reset":
            world.reset(side, *args)  # type: ignore[arg-type]
        elif kind == "ping":
            world.ping(side)
        elif kind == "tick":
            world.tick(*args)  # type: ignore[arg-type]
        else:
            world.deliver(side)
        world.settle()
    world.drain()
    world.check()


# -- edges: window overflow, empty DATA with a flag, credit due on a stream that ended -----------


def test_window_update_beyond_2_32_is_a_protocol_error() -> None:
    a, b = pair()
    open_stream(a, b)
    delta = 2**32 - 1
    with pytest.raises(
        ProtocolError,
        match=f"yamux: WindowUpdate of {delta} for stream 1 makes its window {WINDOW + delta}, beyond {delta}",
    ):
        a.receive_data(h(wu(1, 0, delta)))


def test_empty_data_frame_with_fin_ends_the_stream() -> None:
    a, b = pair()
    _ha, hb = open_stream(a, b)
    assert norm(b.receive_data(data(1, b"", F.FIN))) == [ChannelEnded(hb)]


@pytest.mark.parametrize("then", ["peer_fin", "reset"])
def test_no_window_update_for_a_stream_ended_or_gone_before_output(then: str) -> None:
    a, b = pair()
    ha, hb = open_stream(a, b)
    a.send_data(ha, bytes(HALF))
    pump(a, b)
    b.ack_consumed(hb, HALF)  # credit due, sent with the next output ...
    if then == "peer_fin":
        assert norm(b.receive_data(data(1, b"", F.FIN))) == [ChannelEnded(hb)]
        assert out(b) == b""  # ... but the peer sends no more: none
    else:
        b.reset_channel(hb)
        assert decoded(out(b)) == [Frame(T.WINDOW_UPDATE, F.RST, 1, 0, b"")]  # the reset alone


def test_ping_without_syn_or_ack_is_ignored() -> None:
    _a, b = pair()
    assert b.receive_data(hdr(T.PING, 0, 0, 7)) == []
    assert out(b) == b""
