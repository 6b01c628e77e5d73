"""Tests of the sans-I/O mplex / multiplex engine (``polymux.engine.mplex``).

Engines are driven with bytes in and bytes out: no sockets, no asyncio. Expected output
bytes are spelled out in hex (``header = id << 3 | flag``, then the body length, then the
body; specs/multiplex.md with its erratum, PROTOCOL-NOTES A2); input frames are built with
the codec in ``polymux.wire.mplex``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from polymux.config import SessionConfig
from polymux.engine import flow
from polymux.engine.events import (
    ChannelClosed,
    ChannelEnded,
    ChannelOpened,
    ChannelReset,
    DataReceived,
    Event,
)
from polymux.engine.mplex import MplexEngine
from polymux.exceptions import ProtocolError
from polymux.formats import make_engine
from polymux.wire import mplex as wire
from polymux.wire.mplex import Flag as F, Frame


DIALECTS = ["mplex", "multiplex"]


# -- helpers -----------------------------------------------------------------------------


def pair(dialect: str, **config: int) -> tuple[MplexEngine, MplexEngine]:
    """Two engines of ``dialect`` with the same config (no handshake: both start quiet)."""
    a = MplexEngine(dialect, SessionConfig(**config))
    b = MplexEngine(dialect, SessionConfig(**config))
    assert a.ready and b.ready
    assert out(a) == b"" and out(b) == b""
    return a, b


def out(engine: MplexEngine) -> bytes:
    """Everything ``engine`` wants to send, joined."""
    return b"".join(bytes(chunk) for chunk in engine.data_to_send())


def norm(events: list[Event]) -> list[Event]:
    """Join DataReceived parts into one ``bytes`` (decoded ones are memoryviews)."""
    return [
        DataReceived(e.channel, bytes(e.data) + b"".join(e.more), e.flow_controlled_length)
        if isinstance(e, DataReceived)
        else e
        for e in events
    ]


def pump(a: MplexEngine, b: MplexEngine) -> list[Event]:
    """Move ``a``'s pending output into ``b``; return ``b``'s events (payloads as bytes)."""
    return norm(b.receive_data(out(a)))


def frame(stream_id: int, flag: int, body: bytes = b"") -> bytes:
    return wire.encode_frame(Frame(stream_id, flag, body))


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def open_stream(a: MplexEngine, b: MplexEngine, name: str = "x") -> tuple[int, int]:
    """``a`` opens, ``b`` accepts (nothing goes back); return (a's handle, b's handle)."""
    ha = a.open_channel(name)
    [opened] = pump(a, b)
    assert isinstance(opened, ChannelOpened)
    assert opened.name == name
    b.accept_channel(opened.channel)
    assert out(b) == b""
    return ha, opened.channel


def incoming(engine: MplexEngine, data: bytes) -> int:
    """Feed a NewStream (and whatever follows); accept it; return its handle."""
    events = engine.receive_data(data)
    assert isinstance(events[0], ChannelOpened)
    engine.accept_channel(events[0].channel)
    return events[0].channel


def decoded(data: bytes) -> list[Frame]:
    dec = wire.Decoder()
    frames = [f._replace(body=bytes(f.body)) for f in dec.feed(data)]
    assert dec.pending == 0
    return frames


def assert_protocol_error(engine: MplexEngine, data: bytes, *needles: str) -> ProtocolError:
    """Feed ``data``; expect a ProtocolError naming the format and every needle (regexes)."""
    with pytest.raises(ProtocolError) as info:
        engine.receive_data(data)
    err = info.value
    assert err.format == engine.format
    text = str(err)
    assert text.startswith(f"{engine.format}: ")
    for needle in needles:
        assert re.search(needle, text), (needle, text)
    assert engine.closed
    # a closed engine refuses further input, again naming the format
    with pytest.raises(ProtocolError, match=f"^{engine.format}: "):
        engine.receive_data(frame(0, F.NEW_STREAM))
    return err


# -- construction ------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_engine_properties(dialect: str) -> None:
    engine = MplexEngine(dialect)
    assert engine.format == dialect
    assert engine.ready
    assert engine.needs_acceptance is False
    assert engine.has_flow_control is False
    # default limits: 1 MiB for mplex (go-mplex, js-libp2p-mplex), 16 MiB for multiplex
    assert engine.max_message_size == {"mplex": 1 << 20, "multiplex": 1 << 24}[dialect]
    assert engine.max_frame == 64 * 1024  # min(max_message_size, send_frame 64 KiB)
    assert engine.channel_count == 0
    assert not engine.closed
    assert not engine.has_output
    made = make_engine(dialect)
    assert isinstance(made, MplexEngine) and made.format == dialect


def test_unknown_dialect_is_rejected() -> None:
    with pytest.raises(ValueError, match="dialect"):
        MplexEngine("yamux")


@pytest.mark.parametrize(
    ("config", "max_frame"),
    [
        ({}, 65536),
        ({"max_message_size": 10}, 10),
        ({"send_frame": 7}, 7),
        ({"max_message_size": 100, "send_frame": 100}, 100),
        ({"max_message_size": 2 * 1024 * 1024, "send_frame": 1024 * 1024}, 1024 * 1024),
    ],
)
def test_max_frame_is_the_smaller_limit(config: dict[str, int], max_frame: int) -> None:
    assert MplexEngine("mplex", SessionConfig(**config)).max_frame == max_frame


@pytest.mark.parametrize(("dialect", "limit"), [("mplex", 1 << 20), ("multiplex", 1 << 24)])
def test_default_receive_limit_per_dialect(dialect: str, limit: int) -> None:
    b = MplexEngine(dialect)
    hb = incoming(b, frame(0, F.NEW_STREAM))
    payload = bytes(limit)
    [event] = b.receive_data(frame(0, F.MESSAGE_INITIATOR, payload))
    assert isinstance(event, DataReceived) and event.channel == hb
    assert event.flow_controlled_length == limit
    header = wire.encode_header(0, F.MESSAGE_INITIATOR, limit + 1)
    assert_protocol_error(b, header, f"length {limit + 1}", f"{limit}", r"stream 0\b")


def test_configured_limit_applies_to_both_dialects() -> None:
    for dialect in DIALECTS:
        b = MplexEngine(dialect, SessionConfig(max_message_size=1000))
        assert b.max_message_size == 1000
        incoming(b, frame(0, F.NEW_STREAM))
        assert_protocol_error(b, h("02 e9 07"), "length 1001", "1000")  # 1001 = e9 07


# -- opening -----------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_open_sends_new_stream_with_the_name(dialect: str) -> None:
    a, _b = pair(dialect)
    h0 = a.open_channel("echo")
    assert out(a) == h("00 04 6563686f")  # id 0, NewStream, "echo"
    h1 = a.open_channel("x")
    assert out(a) == h("08 01 78")  # id 1
    h2 = a.open_channel("")
    assert out(a) == h("10 00")  # id 2, empty name: empty body
    h3 = a.open_channel("héllo")
    assert out(a) == h("18 06 68c3a96c6c6f")  # id 3, UTF-8
    assert len({h0, h1, h2, h3}) == 4
    assert a.channel_name(h0) == "echo"
    assert a.channel_name(h2) == "2"  # named by its id, as the receiver names it
    assert a.outbound_count == 4 and a.inbound_count == 0


@pytest.mark.parametrize("dialect", DIALECTS)
def test_receiver_names_streams(dialect: str) -> None:
    b = MplexEngine(dialect)
    data = h("00 04 6563686f") + h("08 00") + h("10 01 31") + h("f8 01 00")
    events = b.receive_data(data)
    assert [(type(e), e.name) for e in events] == [  # type: ignore[attr-defined]
        (ChannelOpened, "echo"),
        (ChannelOpened, "1"),  # empty name: the id's decimal string
        (ChannelOpened, "1"),  # names may repeat
        (ChannelOpened, "31"),  # id 31 (two-byte header f8 01), empty name
    ]
    handles = [e.channel for e in events]  # type: ignore[attr-defined]
    assert len(set(handles)) == 4
    assert [b.channel_name(x) for x in handles] == ["echo", "1", "1", "31"]
    assert b.inbound_count == 4 and b.outbound_count == 0
    assert out(b) == b""  # nothing is sent in reply


@pytest.mark.parametrize("dialect", DIALECTS)
def test_ids_count_from_zero_per_side_and_are_never_reused(dialect: str) -> None:
    a, b = pair(dialect)
    ha = [a.open_channel("a") for _ in range(3)]
    b.open_channel("b")
    b.open_channel("b")
    assert [(f.stream_id, f.flag) for f in decoded(out(a))] == [(0, 0), (1, 0), (2, 0)]
    assert [(f.stream_id, f.flag) for f in decoded(out(b))] == [(0, 0), (1, 0)]
    for handle in ha:
        a.reset_channel(handle)
    a.open_channel("again")
    assert decoded(out(a))[-1] == Frame(3, F.NEW_STREAM, b"again")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_opened_stream_is_usable_at_once(dialect: str) -> None:
    a, _b = pair(dialect)
    ha = a.open_channel("x")
    assert a.send_credit(ha) == flow.UNLIMITED
    a.send_data(ha, b"hi")
    assert out(a) == h("00 01 78 02 02 6869")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_both_sides_open_id_zero_at_once(dialect: str) -> None:
    a, b = pair(dialect)
    ha = a.open_channel("from-a")
    hb = b.open_channel("from-b")
    to_b, to_a = out(a), out(b)
    assert to_b == h("00 06") + b"from-a"
    assert to_a == h("00 06") + b"from-b"
    [opened_at_a] = a.receive_data(to_a)
    [opened_at_b] = b.receive_data(to_b)
    assert isinstance(opened_at_a, ChannelOpened) and opened_at_a.name == "from-b"
    assert isinstance(opened_at_b, ChannelOpened) and opened_at_b.name == "from-a"
    ha2, hb2 = opened_at_a.channel, opened_at_b.channel  # the other side's stream 0
    a.accept_channel(ha2)
    b.accept_channel(hb2)
    assert out(a) == b"" and out(b) == b""
    assert len({ha, ha2}) == 2 and len({hb, hb2}) == 2
    assert a.channel_count == b.channel_count == 2

    # Initiator flags (2, 4, 6) on one's own stream 0, receiver flags (1, 3, 5) on the other's.
    a.send_data(ha, b"A1")
    a.send_data(ha2, b"A2")
    assert out(a) == h("02 02 4131 01 02 4132")
    b.send_data(hb, b"B1")
    b.send_data(hb2, b"B2")
    to_a = out(b)
    assert to_a == h("02 02 4231 01 02 4232")
    assert norm(b.receive_data(h("02 02 4131 01 02 4132"))) == [
        DataReceived(hb2, b"A1", 2),
        DataReceived(hb, b"A2", 2),
    ]
    assert norm(a.receive_data(to_a)) == [DataReceived(ha2, b"B1", 2), DataReceived(ha, b"B2", 2)]

    # Close one's own, reset the other's.
    assert a.end_channel(ha) is False
    a.reset_channel(ha2, "nope")
    to_b = out(a)
    reset_body = "04 6e6f7065" if dialect == "multiplex" else "00"
    assert to_b == h(f"04 00 05 {reset_body}")
    message = "nope" if dialect == "multiplex" else None
    assert norm(b.receive_data(to_b)) == [ChannelEnded(hb2), ChannelReset(hb, message)]
    assert b.is_live(hb2) and not b.is_live(hb)
    assert b.end_channel(hb2) is True
    assert out(b) == h("03 00")
    assert b.channel_count == 0
    assert pump(a, b) == []
    assert a.receive_data(h("03 00")) == [ChannelEnded(ha), ChannelClosed(ha)]
    assert a.channel_count == 0
    assert not a.closed and not b.closed


@pytest.mark.parametrize("dialect", DIALECTS)
def test_accept_sends_nothing_and_only_once(dialect: str) -> None:
    a, b = pair(dialect)
    ha, hb = open_stream(a, b)
    assert not b.has_output
    with pytest.raises(RuntimeError, match=dialect):
        b.accept_channel(hb)
    with pytest.raises(RuntimeError, match=dialect):
        b.reject_channel(hb)
    with pytest.raises(RuntimeError, match=dialect):
        a.accept_channel(ha)  # our own stream
    with pytest.raises(RuntimeError, match=dialect):
        a.reject_channel(ha)
    with pytest.raises(KeyError, match=dialect):
        a.accept_channel(999)


# -- data --------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_data_both_ways(dialect: str) -> None:
    a, b = pair(dialect)
    ha, hb = open_stream(a, b)
    assert a.send_credit(ha) == flow.UNLIMITED
    assert b.send_credit(hb) == flow.UNLIMITED
    a.send_data(ha, b"ping")
    data = out(a)
    assert data == h("02 04 70696e67")
    assert norm(b.receive_data(data)) == [DataReceived(hb, b"ping", 4)]
    b.send_data(hb, bytearray(b"pong"))
    data = out(b)
    assert data == h("01 04 706f6e67")
    assert norm(a.receive_data(data)) == [DataReceived(ha, b"pong", 4)]
    a.ack_consumed(ha, 4)  # no credit on the wire
    b.ack_consumed(hb, 4)
    assert out(a) == b"" and out(b) == b""


@pytest.mark.parametrize("dialect", DIALECTS)
def test_empty_send_sends_nothing(dialect: str) -> None:
    a, b = pair(dialect)
    ha, _hb = open_stream(a, b)
    a.send_data(ha, b"")
    assert not a.has_output


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    "config",
    [{}, {"max_message_size": 10}, {"send_frame": 7}, {"max_message_size": 100, "send_frame": 300}],
)
@pytest.mark.parametrize("side", ["opener", "accepter"])
def test_send_splits_at_max_frame(dialect: str, config: dict[str, int], side: str) -> None:
    a, b = pair(dialect, **config)
    ha, hb = open_stream(a, b)
    sender, handle = (a, ha) if side == "opener" else (b, hb)
    flag = F.MESSAGE_INITIATOR if side == "opener" else F.MESSAGE_RECEIVER
    step = sender.max_frame
    assert step == min(sender.max_message_size, SessionConfig(**config).send_frame)
    for n, sizes in [
        (1, [1]),
        (step - 1, [step - 1]),
        (step, [step]),
        (step + 1, [step, 1]),
        (3 * step, [step] * 3),
        (3 * step + 3, [step, step, step, 3]),
    ]:
        payload = bytes(i % 253 for i in range(n))
        sender.send_data(handle, payload)
        frames = decoded(out(sender))
        assert [len(f.body) for f in frames] == sizes, n
        assert {(f.stream_id, f.flag) for f in frames} == {(0, flag)}
        assert b"".join(f.body for f in frames) == payload


def test_split_frames_are_views_of_the_data() -> None:
    a = MplexEngine("mplex", SessionConfig(send_frame=4))
    ha = a.open_channel("")
    out(a)
    payload = b"abcdefghij"
    a.send_data(ha, payload)
    chunks = a.data_to_send()
    assert [bytes(c) for c in chunks] == [h("02 04"), b"abcd", h("02 04"), b"efgh", h("02 02"), b"ij"]
    for chunk in chunks[1::2]:
        assert isinstance(chunk, memoryview) and chunk.obj is payload
    # data that fits one frame is queued as it is
    small = bytearray(b"xyz")
    a.send_data(ha, small)
    chunks = a.data_to_send()
    assert bytes(chunks[0]) == h("02 03")
    assert chunks[1] is small


@pytest.mark.parametrize("dialect", DIALECTS)
def test_default_split_of_a_large_write(dialect: str) -> None:
    a, b = pair(dialect)
    ha, hb = open_stream(a, b)
    payload = bytes(range(256)) * 800  # 204800 bytes
    assert hb
    a.send_data(ha, payload)
    data = out(a)
    assert [len(f.body) for f in decoded(data)] == [65536, 65536, 65536, 8192]
    assert data[:4] == h("02 80 80 04")  # 65536 = 80 80 04
    [event] = b.receive_data(data)
    assert isinstance(event, DataReceived)
    assert event.flow_controlled_length == len(payload)
    assert bytes(event.data) + b"".join(event.more) == payload
    assert len(event.more) == 3


@pytest.mark.parametrize("dialect", DIALECTS)
def test_consecutive_frames_of_one_stream_arrive_as_one_event(dialect: str) -> None:
    a, b = pair(dialect, send_frame=4)
    ha, hb = open_stream(a, b)
    a.send_data(ha, b"abcdefghij")
    chunk = out(a)
    [event] = b.receive_data(chunk)
    assert isinstance(event, DataReceived)
    assert event.channel == hb
    assert bytes(event.data) == b"abcd"
    assert [bytes(m) for m in event.more] == [b"efgh", b"ij"]
    assert event.flow_controlled_length == 10
    # zero copy: the parts are views of the bytes given to receive_data
    assert isinstance(event.data, memoryview) and event.data.obj is chunk
    assert all(isinstance(m, memoryview) and m.obj is chunk for m in event.more)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_runs_are_broken_by_other_streams_and_control_frames(dialect: str) -> None:
    a, b = pair(dialect)
    hx, bx = open_stream(a, b, "x")
    hy, by = open_stream(a, b, "y")
    a.send_data(hx, b"x1")
    a.send_data(hx, b"x2")
    a.send_data(hy, b"y1")
    a.send_data(hx, b"x3")
    a.send_data(hy, b"")  # nothing at all
    a.send_data(hx, b"x4")
    a.end_channel(hx)
    a.send_data(hy, b"y2")
    a.send_data(hy, b"y3")
    assert pump(a, b) == [
        DataReceived(bx, b"x1x2", 4),
        DataReceived(by, b"y1", 2),
        DataReceived(bx, b"x3x4", 4),
        ChannelEnded(bx),
        DataReceived(by, b"y2y3", 4),
    ]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_empty_data_frames_cause_no_event(dialect: str) -> None:
    b = MplexEngine(dialect)
    hb = incoming(b, frame(0, F.NEW_STREAM))
    assert b.receive_data(frame(0, F.MESSAGE_INITIATOR)) == []
    data = (
        frame(0, F.MESSAGE_INITIATOR, b"a")
        + frame(0, F.MESSAGE_INITIATOR)
        + frame(0, F.MESSAGE_INITIATOR, b"b")
    )
    assert norm(b.receive_data(data)) == [DataReceived(hb, b"ab", 2)]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_data_split_across_reads(dialect: str) -> None:
    a, b = pair(dialect)
    ha, hb = open_stream(a, b)
    a.send_data(ha, b"0123456789")
    data = out(a)
    assert data[:2] == h("02 0a")
    assert b.receive_data(data[:5]) == []  # no partial frames: the body is not complete
    assert norm(b.receive_data(data[5:])) == [DataReceived(hb, b"0123456789", 10)]
    b2 = MplexEngine(dialect)
    hb2 = incoming(b2, frame(0, F.NEW_STREAM, b"x"))
    events: list[Event] = []
    for i in range(len(data)):
        events += norm(b2.receive_data(data[i : i + 1]))
    assert events == [DataReceived(hb2, b"0123456789", 10)]


# -- half-close --------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("first", ["opener", "accepter"])
def test_half_close_each_way(dialect: str, first: str) -> None:
    a, b = pair(dialect)
    ha, hb = open_stream(a, b)
    if first == "opener":
        one, h_one, close_one, two, h_two, close_two, data_two = a, ha, "04 00", b, hb, "03 00", "01"
    else:
        one, h_one, close_one, two, h_two, close_two, data_two = b, hb, "03 00", a, ha, "04 00", "02"

    assert one.end_channel(h_one) is False
    assert out(one) == h(close_one)
    assert one.send_credit(h_one) == 0
    with pytest.raises(RuntimeError, match=dialect):
        one.send_data(h_one, b"late")
    assert one.end_channel(h_one) is False  # idempotent: nothing more is sent
    assert out(one) == b""
    assert one.is_live(h_one)

    assert two.receive_data(h(close_one)) == [ChannelEnded(h_two)]
    assert two.send_credit(h_two) == flow.UNLIMITED  # the other direction is still open
    two.send_data(h_two, b"more")
    data = out(two)
    assert data == h(f"{data_two} 04 6d6f7265")
    assert norm(one.receive_data(data)) == [DataReceived(h_one, b"more", 4)]

    assert two.end_channel(h_two) is True  # both ended: forgotten at once
    assert out(two) == h(close_two)
    assert not two.is_live(h_two)
    assert two.channel_count == 0
    assert two.send_credit(h_two) == 0

    assert one.receive_data(h(close_two)) == [ChannelEnded(h_one), ChannelClosed(h_one)]
    assert not one.is_live(h_one)
    assert one.channel_count == 0
    assert out(one) == b"" and out(two) == b""
    assert not one.closed and not two.closed


@pytest.mark.parametrize("dialect", DIALECTS)
def test_simultaneous_close(dialect: str) -> None:
    a, b = pair(dialect)
    ha, hb = open_stream(a, b)
    assert a.end_channel(ha) is False
    assert b.end_channel(hb) is False
    assert pump(a, b) == [ChannelEnded(hb), ChannelClosed(hb)]
    assert pump(b, a) == [ChannelEnded(ha), ChannelClosed(ha)]
    assert a.channel_count == b.channel_count == 0


@pytest.mark.parametrize("dialect", DIALECTS)
def test_repeated_close_from_the_peer_changes_nothing(dialect: str) -> None:
    b = MplexEngine(dialect)
    hb = incoming(b, frame(0, F.NEW_STREAM))
    assert b.receive_data(frame(0, F.CLOSE_INITIATOR)) == [ChannelEnded(hb)]
    assert b.receive_data(frame(0, F.CLOSE_INITIATOR)) == []
    assert b.is_live(hb) and not b.closed


# -- reset -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "message", "wire_body", "received"),
    [
        ("multiplex", "boom", "04 626f6f6d", "boom"),
        ("multiplex", "ünï ✓", "09 c3bc6ec3af20e29c93", "ünï ✓"),
        ("multiplex", None, "00", None),
        ("multiplex", "", "00", None),
        ("mplex", "boom", "00", None),  # libp2p mplex: reset bodies are empty
        ("mplex", None, "00", None),
    ],
)
@pytest.mark.parametrize("side", ["opener", "accepter"])
def test_reset(dialect: str, message: str | None, wire_body: str, received: str | None, side: str) -> None:
    a, b = pair(dialect)
    ha, hb = open_stream(a, b)
    one, h_one, two, h_two, flag = (a, ha, b, hb, "06") if side == "opener" else (b, hb, a, ha, "05")
    one.reset_channel(h_one, message)
    data = out(one)
    assert data == h(f"{flag} {wire_body}")
    assert not one.is_live(h_one)
    assert one.channel_count == 0
    assert one.send_credit(h_one) == 0
    assert two.receive_data(data) == [ChannelReset(h_two, received)]
    assert not two.is_live(h_two)
    assert two.channel_count == 0
    assert out(two) == b""  # no answer to a reset
    one.reset_channel(h_one, "again")  # a forgotten stream: no-op
    assert out(one) == b""
    assert not one.closed and not two.closed


@pytest.mark.parametrize("dialect", DIALECTS)
def test_reset_body_received_is_surfaced_in_both_dialects(dialect: str) -> None:
    b = MplexEngine(dialect)
    hb = incoming(b, frame(0, F.NEW_STREAM))
    assert b.receive_data(frame(0, F.RESET_INITIATOR, b"Channel destroyed")) == [
        ChannelReset(hb, "Channel destroyed")
    ]
    hb = incoming(b, frame(1, F.NEW_STREAM))
    assert b.receive_data(frame(1, F.RESET_INITIATOR, b"bad \xff")) == [ChannelReset(hb, "bad \ufffd")]
    assert not b.closed


@pytest.mark.parametrize("dialect", DIALECTS)
def test_reset_after_half_close(dialect: str) -> None:
    a, b = pair(dialect)
    ha, hb = open_stream(a, b)
    a.end_channel(ha)
    a.reset_channel(ha)
    assert out(a) == h("04 00 06 00")
    assert pump(a, b) == []  # (already drained)
    assert b.receive_data(h("04 00 06 00")) == [ChannelEnded(hb), ChannelReset(hb, None)]


@pytest.mark.parametrize(
    ("dialect", "expected", "message"),
    [("mplex", "05 00", None), ("multiplex", "05 0e" + b"stream refused".hex(), "stream refused")],
)
def test_reject_sends_a_reset(dialect: str, expected: str, message: str | None) -> None:
    a, b = pair(dialect)
    ha = a.open_channel("no")
    [opened] = pump(a, b)
    assert isinstance(opened, ChannelOpened)
    hb = opened.channel
    assert b.send_credit(hb) == 0  # not accepted
    b.reject_channel(hb)
    assert not b.is_live(hb) and b.channel_count == 0
    data = out(b)
    assert data == h(expected)
    assert a.receive_data(data) == [ChannelReset(ha, message)]
    assert a.channel_count == 0
    with pytest.raises(KeyError):
        b.accept_channel(hb)


# -- documented ignores ------------------------------------------------------------------

STREAM_FRAMES = [
    pytest.param(F.MESSAGE_RECEIVER, b"x", id="data-receiver"),
    pytest.param(F.MESSAGE_INITIATOR, b"x", id="data-initiator"),
    pytest.param(F.CLOSE_RECEIVER, b"", id="close-receiver"),
    pytest.param(F.CLOSE_INITIATOR, b"", id="close-initiator"),
    pytest.param(F.RESET_RECEIVER, b"", id="reset-receiver"),
    pytest.param(F.RESET_INITIATOR, b"boom", id="reset-initiator"),
]


def _assert_ignored(engine: MplexEngine, data: bytes) -> None:
    before = engine.channel_count
    assert engine.receive_data(data) == []
    assert out(engine) == b""
    assert not engine.closed
    assert engine.channel_count == before


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(("flag", "body"), STREAM_FRAMES)
@pytest.mark.parametrize("stream_id", [0, 5, 2**60 - 1])
def test_frames_for_a_stream_never_opened_are_ignored(
    dialect: str, flag: int, body: bytes, stream_id: int
) -> None:
    a, b = pair(dialect)
    _assert_ignored(b, frame(stream_id, flag, body))
    # with streams about, the other side's id space is still empty for that id
    if stream_id != 0:
        ha, hb = open_stream(a, b)
        _assert_ignored(b, frame(stream_id, flag, body))
        _assert_ignored(a, frame(stream_id, flag, body))
        a.send_data(ha, b"ok")
        assert pump(a, b) == [DataReceived(hb, b"ok", 2)]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(("flag", "body"), STREAM_FRAMES)
def test_initiator_flags_for_our_own_stream_id_are_not_ours(dialect: str, flag: int, body: bytes) -> None:
    # We opened stream 0; initiator flags with id 0 name the peer's stream 0, which does not
    # exist: ignored, and our stream 0 is untouched (and vice versa for the peer's).
    a, b = pair(dialect)
    ha = a.open_channel("mine")
    out(a)
    if flag % 2 == 0:
        _assert_ignored(a, frame(0, flag, body))
        assert a.is_live(ha) and a.send_credit(ha) == flow.UNLIMITED
    else:
        hb = incoming(b, frame(0, F.NEW_STREAM))
        _assert_ignored(b, frame(0, flag, body))
        assert b.is_live(hb)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(("flag", "body"), STREAM_FRAMES)
@pytest.mark.parametrize(
    ("how", "owner"),
    [
        *[(how, owner) for how in ("we-reset", "peer-reset", "both-closed") for owner in ("peer", "us")],
        ("we-rejected", "peer"),  # only incoming streams are rejected
    ],
)
def test_frames_for_a_gone_stream_are_ignored(
    dialect: str, flag: int, body: bytes, how: str, owner: str
) -> None:
    a, b = pair(dialect)
    if how == "we-rejected":
        b.open_channel("")
        [opened] = pump(b, a)
        assert isinstance(opened, ChannelOpened)
        a.reject_channel(opened.channel)
        out(a)
    else:
        if owner == "peer":
            hb, ha = open_stream(b, a)
        else:
            ha, hb = open_stream(a, b)
        if how == "we-reset":
            a.reset_channel(ha)
            pump(a, b)
        elif how == "peer-reset":
            b.reset_channel(hb, "x")
            assert pump(b, a) == [ChannelReset(ha, "x" if dialect == "multiplex" else None)]
        else:
            a.end_channel(ha)
            b.end_channel(hb)
            pump(a, b)
            assert pump(b, a) == [ChannelEnded(ha), ChannelClosed(ha)]
    assert a.channel_count == 0
    # The flag as the peer would send it for that stream: initiator flags (even) for its own
    # stream, receiver flags (odd) for ours; the table covers both.
    _assert_ignored(a, frame(0, flag, body))
    # The engine is still in business.
    hc, hd = open_stream(a, b)
    b.send_data(hd, b"still")
    assert pump(b, a) == [DataReceived(hc, b"still", 5)]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_data_in_flight_when_we_reset_is_ignored(dialect: str) -> None:
    a, b = pair(dialect)
    ha, hb = open_stream(a, b)
    b.send_data(hb, b"in flight")
    b.end_channel(hb)
    a.reset_channel(ha)
    assert pump(b, a) == []
    assert pump(a, b) == [ChannelReset(hb, None)]  # b had only half-closed it
    assert not a.closed and not b.closed
    assert a.channel_count == b.channel_count == 0


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("how", ["peer-reset", "we-reset", "both-closed"])
def test_peer_may_reuse_an_id_once_the_stream_is_gone(dialect: str, how: str) -> None:
    b = MplexEngine(dialect)
    first = incoming(b, frame(0, F.NEW_STREAM, b"first"))
    if how == "peer-reset":
        assert b.receive_data(frame(0, F.RESET_INITIATOR)) == [ChannelReset(first, None)]
    elif how == "we-reset":
        b.reset_channel(first)
        assert out(b) == h("05 00")
    else:
        assert b.end_channel(first) is False
        assert b.receive_data(frame(0, F.CLOSE_INITIATOR)) == [ChannelEnded(first), ChannelClosed(first)]
    [opened] = b.receive_data(frame(0, F.NEW_STREAM, b"second") + frame(0, F.MESSAGE_INITIATOR, b"hi"))[:1]
    assert isinstance(opened, ChannelOpened)
    assert opened.name == "second"
    assert opened.channel != first
    assert b.channel_name(opened.channel) == "second"
    assert not b.closed


# -- protocol errors ---------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("state", ["open", "peer-closed", "we-closed"])
def test_error_new_stream_for_an_id_in_use(dialect: str, state: str) -> None:
    b = MplexEngine(dialect)
    hb = incoming(b, frame(3, F.NEW_STREAM, b"x"))
    if state == "peer-closed":
        assert b.receive_data(frame(3, F.CLOSE_INITIATOR)) == [ChannelEnded(hb)]
    elif state == "we-closed":
        b.end_channel(hb)
    assert_protocol_error(b, frame(3, F.NEW_STREAM, b"y"), "NewStream", r"stream 3\b", "already")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_new_stream_for_an_id_we_use_is_fine(dialect: str) -> None:
    b = MplexEngine(dialect)
    b.open_channel("ours")
    [opened] = b.receive_data(frame(0, F.NEW_STREAM, b"theirs"))
    assert isinstance(opened, ChannelOpened) and opened.name == "theirs"


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("owner", ["peer", "us"])
def test_error_data_after_the_peers_close(dialect: str, owner: str) -> None:
    b = MplexEngine(dialect)
    if owner == "peer":
        incoming(b, frame(7, F.NEW_STREAM, b"s"))
        data = frame(7, F.CLOSE_INITIATOR) + frame(7, F.MESSAGE_INITIATOR, b"x")
        assert_protocol_error(b, data, r"channel 7 \(remote, 's'\)", "after the peer closed")
    else:
        for _ in range(8):
            b.open_channel("s")
        data = frame(7, F.CLOSE_RECEIVER) + frame(7, F.MESSAGE_RECEIVER, b"x")
        assert_protocol_error(b, data, r"channel 7 \(local, 's'\)", "after the peer closed")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_error_data_after_the_peers_close_in_a_later_read(dialect: str) -> None:
    b = MplexEngine(dialect)
    hb = incoming(b, frame(0, F.NEW_STREAM))
    assert b.receive_data(frame(0, F.CLOSE_INITIATOR)) == [ChannelEnded(hb)]
    assert_protocol_error(b, frame(0, F.MESSAGE_INITIATOR, b"x"), "channel 0", "after the peer closed")


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(("stream_id", "name"), [(0, b"\xff\xfe"), (7, b"ok\xc3"), (300, b"\x80")])
def test_error_new_stream_name_not_utf8(dialect: str, stream_id: int, name: bytes) -> None:
    b = MplexEngine(dialect)
    assert_protocol_error(
        b, frame(stream_id, F.NEW_STREAM, name), "NewStream name", f"stream {stream_id}\\b", "UTF-8"
    )


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    ("data", "config", "needles"),
    [
        ("07 00", {}, ["flag 7", r"stream id 0\b"]),
        ("0f 01 78", {}, ["flag 7", r"stream id 1\b"]),
        ("80" * 10, {}, ["header varint"]),
        ("02" + "80" * 10, {}, ["length varint"]),
        ("0a 81 80 80 08", {}, ["16777217", r"stream 1\b"]),  # 16 MiB + 1: over both defaults
        ("12 80 01", {"max_message_size": 100}, ["length 128", r"stream 2\b", "100"]),
    ],
)
def test_error_malformed_frames(dialect: str, data: str, config: dict[str, int], needles: list[str]) -> None:
    b = MplexEngine(dialect, SessionConfig(**config))
    assert_protocol_error(b, h(data), *needles)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_error_malformed_frame_after_good_ones(dialect: str) -> None:
    b = MplexEngine(dialect)
    incoming(b, frame(0, F.NEW_STREAM))
    assert_protocol_error(b, frame(0, F.MESSAGE_INITIATOR, b"x") + h("0f 00"), "flag 7")


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("size", [101, 127, 128])
def test_error_frame_over_a_small_max_message_size(dialect: str, size: int) -> None:
    b = MplexEngine(dialect, SessionConfig(max_message_size=100))
    hb = incoming(b, frame(0, F.NEW_STREAM))
    assert norm(b.receive_data(frame(0, F.MESSAGE_INITIATOR, bytes(100)))) == [
        DataReceived(hb, bytes(100), 100)
    ]
    # whole frame in one read (101 and 127 take the decoder's one-byte-length fast path)
    data = frame(0, F.MESSAGE_INITIATOR, bytes(size))
    assert_protocol_error(b, data, f"length {size}", "100", r"stream 0\b")


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(("partial", "count"), [("82", 1), ("02 05 61 62", 4), ("02", 1), ("00 03", 2)])
def test_error_eof_inside_a_frame(dialect: str, partial: str, count: int) -> None:
    b = MplexEngine(dialect)
    incoming(b, frame(0, F.NEW_STREAM))
    assert b.receive_data(h(partial)) == []
    assert not b.closed
    with pytest.raises(ProtocolError) as info:
        b.receive_eof()
    assert info.value.format == dialect
    assert str(info.value).startswith(f"{dialect}: ")
    assert "inside a frame" in info.value.detail
    assert f"{count} bytes" in info.value.detail
    assert b.closed


@pytest.mark.parametrize("dialect", DIALECTS)
def test_clean_eof_then_data_is_an_error(dialect: str) -> None:
    b = MplexEngine(dialect)
    incoming(b, frame(0, F.NEW_STREAM) + frame(0, F.MESSAGE_INITIATOR, b"x"))
    b.receive_eof()
    assert b.closed
    with pytest.raises(ProtocolError) as info:
        b.receive_data(frame(0, F.MESSAGE_INITIATOR, b"y"))
    assert info.value.format == dialect
    assert "after the session ended" in info.value.detail


# -- property: random interleavings conserve bytes ---------------------------------------


@dataclass
class Side:
    """The application on one end: what it wrote, what it read."""

    name: str
    engine: MplexEngine
    handles: dict[str, int] = field(default_factory=dict)  # stream name -> handle
    names: dict[int, str] = field(default_factory=dict)  # handle -> stream name
    written: dict[str, bytearray] = field(default_factory=dict)
    outbox: dict[str, bytearray] = field(default_factory=dict)  # written, not yet sent
    received: dict[str, bytearray] = field(default_factory=dict)
    want_end: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)  # closed, rejected or reset here
    refused: set[int] = field(default_factory=set)  # handles of incoming streams we rejected
    opened: int = 0

    def known(self) -> list[str]:
        return sorted(self.handles)

    def learn(self, name: str, handle: int) -> None:
        self.handles[name] = handle
        self.names[handle] = name
        self.written.setdefault(name, bytearray())
        self.outbox.setdefault(name, bytearray())
        self.received.setdefault(name, bytearray())


class World:
    def __init__(self, dialect: str, send_frame: int, reject: set[int], split: int) -> None:
        ea, eb = pair(dialect, send_frame=send_frame)
        self.dialect = dialect
        self.a = Side("a", ea)
        self.b = Side("b", eb)
        self.reject = reject  # the k-th stream each side opens is rejected by the other
        self.split = split  # the wire is cut into pieces of this size
        self.reset_names: dict[str, str | None] = {}  # name -> the message its peer sees
        self.counter = 0

    def other(self, side: Side) -> Side:
        return self.b if side is self.a else self.a

    def open(self, side: Side) -> None:
        name = f"{side.name}{side.opened}"
        side.opened += 1
        side.learn(name, side.engine.open_channel(name))

    def write(self, side: Side, idx: int, n: int) -> None:
        names = [c for c in side.known() if c not in side.want_end and c not in self.reset_names]
        if not names:
            return
        name = names[idx % len(names)]
        data = bytes((self.counter + i) % 251 for i in range(n))
        self.counter += n
        side.written[name] += data
        side.outbox[name] += data

    def end(self, side: Side, idx: int) -> None:
        names = [c for c in side.known() if c not in side.want_end]
        if names:
            side.want_end.add(names[idx % len(names)])

    def reset(self, side: Side, idx: int, message: str | None) -> None:
        names = [c for c in side.known() if side.engine.is_live(side.handles[c])]
        if not names:
            return
        name = names[idx % len(names)]
        # (only the first reset of a stream can reach the other side: the second side to
        # reset has either forgotten it already or its reset crosses the first one)
        self.reset_names.setdefault(name, (message or None) if self.dialect == "multiplex" else None)
        side.engine.reset_channel(side.handles[name], message)
        side.gone.add(name)

    def deliver(self, side: Side) -> bool:
        """Send ``side``'s output to the other side in pieces; handle the events there."""
        data = out(side.engine)
        if not data:
            return False
        peer = self.other(side)
        for i in range(0, len(data), self.split):
            for event in peer.engine.receive_data(data[i : i + self.split]):
                self.handle(peer, event)
        return True

    def handle(self, peer: Side, event: Event) -> None:
        engine = peer.engine
        if isinstance(event, ChannelOpened):
            if int(event.name[1:]) in self.reject:
                peer.refused.add(event.channel)
                if engine.is_live(event.channel):
                    engine.reject_channel(event.channel)
                    self.reset_names.setdefault(
                        event.name, "stream refused" if self.dialect == "multiplex" else None
                    )
                return
            peer.learn(event.name, event.channel)
            if engine.is_live(event.channel):  # (a reset may have followed in the same read)
                engine.accept_channel(event.channel)
            return
        assert not engine.closed
        if event.channel in peer.refused:  # type: ignore[attr-defined]
            # events of the same read as the NewStream, before we refused it
            assert isinstance(event, DataReceived | ChannelEnded | ChannelReset), event
            return
        name = peer.names[event.channel]  # type: ignore[attr-defined]
        if isinstance(event, DataReceived):
            data = bytes(event.data) + b"".join(event.more)
            assert event.flow_controlled_length == len(data) > 0
            peer.received[name] += data
        elif isinstance(event, ChannelEnded):
            assert name not in peer.gone
        elif isinstance(event, ChannelClosed):
            assert event.local_done
            assert name in peer.ended
            peer.gone.add(name)
        elif isinstance(event, ChannelReset):
            assert name in self.reset_names, (name, event)
            assert event.message == self.reset_names[name], (name, event)
            peer.gone.add(name)
        else:
            pytest.fail(f"unexpected event {event!r}")

    def flush(self, side: Side) -> bool:
        """Send every outbox (in one write each); end streams whose outbox emptied."""
        engine = side.engine
        progress = False
        for name in side.known():
            handle = side.handles[name]
            if not engine.is_live(handle):
                continue
            box = side.outbox[name]
            if box and name not in side.ended:
                assert engine.send_credit(handle) == flow.UNLIMITED
                engine.send_data(handle, bytes(box))
                box.clear()
                progress = True
            if name in side.want_end and name not in side.ended:
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
        """End everything and run until quiet."""
        for _ in range(10_000):
            progress = False
            for side in (self.a, self.b):
                side.want_end.update(side.known())
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


SIDE = st.sampled_from(["a", "b"])
_OPEN = st.tuples(st.just("open"), SIDE)
_WRITE = st.tuples(st.just("write"), SIDE, st.integers(0, 7), st.integers(1, 700))
_END = st.tuples(st.just("end"), SIDE, st.integers(0, 7))
_RESET = st.tuples(st.just("reset"), SIDE, st.integers(0, 7), st.sampled_from([None, "", "boom", "ünï"]))
_PUMP = st.tuples(st.just("pump"), SIDE)
COMMANDS = st.lists(
    st.one_of(_OPEN, _OPEN, _WRITE, _WRITE, _WRITE, _END, _RESET, _PUMP, _PUMP, _PUMP),
    min_size=3,
    max_size=60,
).map(lambda cmds: [("open", "a"), ("open", "b"), ("write", "a", 0, 250), ("write", "b", 0, 250), *cmds])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dialect=st.sampled_from(DIALECTS),
    send_frame=st.sampled_from([1, 16, 100, 65536]),
    reject=st.sets(st.integers(0, 6), max_size=2),
    split=st.sampled_from([1, 7, 100, 1 << 30]),
    commands=COMMANDS,
)
def test_random_interleavings_conserve_bytes(
    dialect: str, send_frame: int, reject: set[int], split: int, commands: list[tuple[object, ...]]
) -> None:
    world = World(dialect, send_frame, reject, split)
    for command in commands:
        kind, side_name, *args = command
        side = world.a if side_name == "a" else world.b
        if kind == "open":
            world.open(side)
        elif kind == "write":
            world.write(side, *args)  # type: ignore[arg-type]
        elif kind == "end":
            world.end(side, *args)  # type: ignore[arg-type]
        elif kind == "reset":
            world.reset(side, *args)  # type: ignore[arg-type]
        else:
            world.deliver(side)
        world.settle()
    world.drain()
    world.check()


@settings(max_examples=300, deadline=None)
@given(
    dialect=st.sampled_from(DIALECTS),
    chunks=st.lists(
        st.one_of(
            st.binary(max_size=12),
            st.builds(
                lambda i, f, b: frame(i, f, b), st.integers(0, 3), st.integers(0, 6), st.binary(max_size=5)
            ),
        ),
        max_size=12,
    ),
)
def test_arbitrary_input_never_raises_anything_but_protocol_error(dialect: str, chunks: list[bytes]) -> None:
    engine = MplexEngine(dialect)
    try:
        for chunk in chunks:
            for event in engine.receive_data(chunk):
                if isinstance(event, ChannelOpened) and engine.is_live(event.channel):
                    engine.accept_channel(event.channel)
            out(engine)
        engine.receive_eof()
    except ProtocolError as exc:
        assert exc.format == dialect
        assert engine.closed
