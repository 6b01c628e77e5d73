"""Tests of the sans-I/O Streamux engine (``polymux.engine.streamux``).

Two engines with a fixed ``random_id=`` (so the first request id is known) are joined by
``pump``: the bytes one wants to send go into the other. No sockets, no asyncio.

Expected bytes are spelled out where the layout is the point: the 5-byte initialize
message (version, then a big-endian word: 2 reserved bits, quick-init request, quick-init
allowed, id min/max/recommended, length min/max/recommended) and chunk headers (a
little-endian integer; from the least significant bit: termination, response, length,
id). Other chunks are built and decoded with the codec in ``polymux.wire.streamux``
(specs/streamux.md at 685ebce, PROTOCOL-NOTES A4).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from polymux.config import SessionConfig
from polymux.engine import flow
from polymux.engine.events import (
    ChannelClosed,
    ChannelEnded,
    ChannelOpened,
    ChannelReset,
    CreditAvailable,
    DataReceived,
    Event,
    PingAcked,
    SessionReady,
)
from polymux.engine.streamux import StreamuxEngine, StreamuxOptions
from polymux.exceptions import LimitExceeded, ProtocolError
from polymux.formats import make_engine
from polymux.wire import streamux as wire
from polymux.wire.streamux import Chunk, InitMessage, Negotiated, NegotiationError


pytestmark = pytest.mark.timeout(60)

DEFAULT_INIT = bytes.fromhex("01 01eb9bd0")
"""Version 1; word 0x01eb9bd0 = id 1/29/14 (bits 27-24, 23-19, 18-14), length 6/30/16
(bits 13-10, 9-5, 4-0), no quick init: ``SessionConfig()``'s offer."""

DEFAULT = Negotiated(14, 16)
"""What two default engines negotiate: 4-byte headers, 64 KiB - 1 chunks."""

Offer = tuple[tuple[int, int, int], tuple[int, int, int]]
"""(id bits, length bits), each (min, max, recommended)."""

SMALL: dict[str, Any] = {"streamux_id_bits": (1, 8, 8), "streamux_length_bits": (6, 12, 12)}
"""A 3-byte header (8 + 12 + 2 = 22 bits: the two top bits unused)."""


# -- helpers -----------------------------------------------------------------------------


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def engine(random_id: int = 5, **config: Any) -> StreamuxEngine:
    return StreamuxEngine(SessionConfig(**config), random_id=random_id)


def out(e: StreamuxEngine) -> bytes:
    """Everything ``e`` wants to send, joined."""
    return b"".join(bytes(chunk) for chunk in e.data_to_send())


def norm(events: list[Event]) -> list[Event]:
    """DataReceived payloads as ``bytes`` (decoded ones are memoryviews)."""
    return [
        DataReceived(e.channel, bytes(e.data) + b"".join(e.more), e.flow_controlled_length)
        if isinstance(e, DataReceived)
        else e
        for e in events
    ]


def pump(src: StreamuxEngine, dst: StreamuxEngine) -> list[Event]:
    """Move ``src``'s pending output into ``dst``; return ``dst``'s events."""
    return feed(dst, out(src))


def feed(dst: StreamuxEngine, data: bytes) -> list[Event]:
    """``dst.receive_data(data)``'s events; incoming requests are accepted (as the I/O
    layer does) so that they can be answered."""
    events = norm(dst.receive_data(data))
    for event in events:
        if isinstance(event, ChannelOpened):
            dst.accept_channel(event.channel)
    return events


def handshake(a: StreamuxEngine, b: StreamuxEngine) -> None:
    """Exchange the initialize messages; both become ready."""
    assert not a.ready and not b.ready
    assert pump(a, b) == [SessionReady()]
    assert pump(b, a) == [SessionReady()]
    assert a.ready and b.ready
    assert a.negotiated == b.negotiated


def pair(
    a_id: int = 5, b_id: int = 5, a_config: dict[str, Any] | None = None, **config: Any
) -> tuple[StreamuxEngine, StreamuxEngine]:
    """Two negotiated engines (``a_config`` overrides ``config`` for ``a``)."""
    a = engine(a_id, **{**config, **(a_config or {})})
    b = engine(b_id, **config)
    handshake(a, b)
    return a, b


def hdr(n: Negotiated, cid: int, length: int, *, resp: bool = False, term: bool = False) -> bytes:
    return wire.encode_header(n, cid, length, resp, term)


def decoded(n: Negotiated, data: bytes) -> list[Chunk]:
    """The chunks in ``data`` (payloads as bytes); nothing may be left over."""
    dec = wire.Decoder(n)
    chunks = [c._replace(payload=bytes(c.payload)) for c in dec.feed(data)]
    assert dec.pending == 0
    return chunks


def opened(events: list[Event]) -> int:
    """The handle of the one ChannelOpened in ``events``."""
    [handle] = [e.channel for e in events if isinstance(e, ChannelOpened)]
    return handle


def served_request(a: StreamuxEngine, b: StreamuxEngine, body: bytes = b"r") -> tuple[int, int]:
    """``a`` starts a request (not ended) with ``body``; returns (``a``'s handle, ``b``'s)."""
    ha = a.open_channel()
    a.send_data(ha, body)
    return ha, opened(pump(a, b))


def assert_protocol_error(e: StreamuxEngine, data: bytes, *needles: str) -> ProtocolError:
    """Feed ``data``; expect a ProtocolError naming "streamux" and every needle (regexes)."""
    with pytest.raises(ProtocolError) as info:
        e.receive_data(data)
    err = info.value
    assert err.format == "streamux"
    text = str(err)
    assert text.startswith("streamux: ")
    for needle in needles:
        assert re.search(needle, text), (needle, text)
    assert e.closed
    # a closed engine refuses further input, again naming the format
    with pytest.raises(ProtocolError, match="^streamux: .*after the session ended"):
        e.receive_data(b"\x00")
    return err


# -- construction and the initialize message ---------------------------------------------


def test_engine_properties() -> None:
    e = StreamuxEngine()
    assert e.format == "streamux"
    assert e.has_flow_control is False
    assert e.needs_acceptance is False
    assert not e.ready
    assert e.negotiated is None
    assert e.channel_count == 0
    assert not e.closed
    assert e.rtt is None
    made = make_engine("streamux")
    assert isinstance(made, StreamuxEngine)
    assert not made.ready


def test_each_engine_first_sends_its_init_message() -> None:
    a = StreamuxEngine()
    assert a.has_output
    assert out(a) == DEFAULT_INIT
    assert not a.has_output  # once only
    assert wire.decode_init(DEFAULT_INIT) == InitMessage()
    assert a.ours == InitMessage()


@pytest.mark.parametrize(
    ("config", "init"),
    [
        ({}, "01 01eb9bd0"),
        ({"streamux_quick_init": "request"}, "01 21eb9bd0"),  # bit 29
        ({"streamux_quick_init": "allow"}, "01 11eb9bd0"),  # bit 28
        # id 0/0/0, length 1/1/1: 0<<24 | 0<<19 | 0<<14 | 1<<10 | 1<<5 | 1
        ({"streamux_id_bits": (0, 0, 0), "streamux_length_bits": (1, 1, 1)}, "01 00000421"),
        # wildcards: 31 in both recommended fields
        ({"streamux_id_bits": (1, 29, 31), "streamux_length_bits": (6, 30, 31)}, "01 01efdbdf"),
        # id 15/29/29 length 15/30/30: all the maxima
        ({"streamux_id_bits": (15, 29, 29), "streamux_length_bits": (15, 30, 30)}, "01 0fef7fde"),
    ],
)
def test_init_message_bytes(config: dict[str, Any], init: str) -> None:
    assert out(engine(**config)) == h(init)


@pytest.mark.parametrize(
    "config",
    [
        {"streamux_id_bits": (5, 3, 4)},  # max < min
        {"streamux_id_bits": (1, 8, 9)},  # recommended outside min..max
        {"streamux_id_bits": (16, 20, 18)},  # min over 15
        {"streamux_id_bits": (1, 30, 14)},  # max over 29
        {"streamux_length_bits": (0, 12, 8)},  # length min 0
        {"streamux_length_bits": (6, 31, 16)},  # max over 30
        {"streamux_quick_init": "request", "streamux_id_bits": (1, 29, 31)},  # wildcard + quick
    ],
)
def test_invalid_settings_are_a_value_error(config: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="invalid streamux settings"):
        engine(**config)


def test_ready_only_after_the_peers_init() -> None:
    a, b = engine(), engine()
    assert not a.ready
    # Nothing but the init message can be sent before negotiation.
    with pytest.raises(RuntimeError, match="streamux: cannot start a request before negotiation"):
        a.open_channel()
    with pytest.raises(RuntimeError, match="before negotiation"):
        a.ping()
    init = out(b)
    # the init message split anywhere: no event until its last byte
    for i in range(4):
        assert a.receive_data(init[i : i + 1]) == []
        assert not a.ready
    assert a.receive_data(init[4:]) == [SessionReady()]
    assert a.ready
    assert a.negotiated == DEFAULT
    assert a.theirs == InitMessage()
    assert a.max_frame == 65535  # min(2**16 - 1, send_frame 64 KiB)
    assert a.receive_data(b"") == []  # SessionReady comes once
    assert out(a) == DEFAULT_INIT  # a's own init was still waiting to be sent
    a.open_channel()
    assert not a.has_output  # opening a request sends nothing yet
    assert b.receive_data(DEFAULT_INIT) == [SessionReady()]


def test_init_and_chunks_in_one_read_byte_by_byte() -> None:
    a, b = engine(), engine()
    b_init = out(b)
    assert a.receive_data(b_init) == [SessionReady()]
    ha = a.open_channel()
    a.send_data(ha, b"hello")
    a.end_channel(ha)
    data = out(a)  # a's init and the whole request
    events: list[Event] = []
    for i in range(len(data)):
        events += norm(b.receive_data(data[i : i + 1]))
    hb = opened(events)
    assert [e for e in events if not isinstance(e, DataReceived)] == [
        SessionReady(),
        ChannelOpened(hb, "5"),
        ChannelEnded(hb),
    ]
    assert b"".join(bytes(e.data) for e in events if isinstance(e, DataReceived)) == b"hello"


@pytest.mark.parametrize(
    ("ours", "theirs", "negotiated"),
    [
        (None, None, Negotiated(14, 16)),
        # the spec's examples
        (((6, 12, 8), (6, 20, 14)), ((6, 15, 7), (5, 15, 15)), Negotiated(7, 14)),
        (((6, 16, 14), (6, 20, 31)), ((6, 18, 15), (15, 18, 31)), Negotiated(14, 16)),
        (((6, 16, 31), (6, 20, 31)), ((6, 18, 31), (8, 15, 31)), Negotiated(11, 12)),
        # a recommendation below the other's min is clamped
        (((1, 29, 2), (6, 30, 16)), ((5, 29, 14), (6, 30, 16)), Negotiated(5, 16)),
        # both over 15: 15 and 15
        (((1, 29, 20), (6, 30, 20)), ((1, 29, 20), (6, 30, 20)), Negotiated(15, 15)),
        # zero id bits: one request at a time
        (((0, 0, 0), (1, 6, 6)), ((0, 4, 2), (1, 8, 8)), Negotiated(0, 6)),
    ],
)
def test_both_engines_negotiate_the_same_widths(
    ours: Offer | None, theirs: Offer | None, negotiated: Negotiated
) -> None:
    def cfg(bits: Offer | None) -> dict[str, Any]:
        if bits is None:
            return {}  # the defaults
        return {"streamux_id_bits": bits[0], "streamux_length_bits": bits[1]}

    a, b = engine(**cfg(ours)), engine(**cfg(theirs))
    handshake(a, b)
    assert a.negotiated == b.negotiated == negotiated


@pytest.mark.parametrize(
    ("config", "max_frame"),
    [
        ({}, 65535),
        ({"send_frame": 7}, 7),
        ({"streamux_length_bits": (6, 12, 12)}, 4095),
        ({"streamux_length_bits": (6, 12, 12), "send_frame": 100}, 100),
        ({"streamux_length_bits": (6, 12, 12), "send_frame": 4096}, 4095),
        ({"streamux_length_bits": (1, 1, 1)}, 1),
    ],
)
def test_max_frame_is_the_smaller_of_the_width_and_send_frame(config: dict[str, Any], max_frame: int) -> None:
    a, b = pair(**config)
    assert a.max_frame == b.max_frame == max_frame
    assert a.negotiated is not None
    assert max_frame == min(a.negotiated.max_length, a.config.send_frame)


# -- quick init --------------------------------------------------------------------------


def test_quick_init_requester_sends_at_once() -> None:
    # The server would recommend 8/10; quick init makes the requester's 10/12 win.
    a = engine(
        5, streamux_quick_init="request", streamux_id_bits=(1, 29, 10), streamux_length_bits=(6, 30, 12)
    )
    b = engine(5, streamux_quick_init="allow", streamux_id_bits=(1, 29, 8), streamux_length_bits=(6, 30, 10))
    assert a.ready and not b.ready
    assert a.negotiated == Negotiated(10, 12)
    assert a.max_frame == 4095
    ha = a.open_channel()
    a.send_data(ha, b"x" * 5000)
    a.end_channel(ha)
    data = out(a)
    assert data[:5] == h("01 21") + data[2:5]
    assert wire.decode_init(data[:5]).quick_request
    # The server has not said anything yet; the request is already on its way.
    events = feed(b, data)
    hb = opened(events)
    assert events == [
        SessionReady(),
        ChannelOpened(hb, "5"),
        DataReceived(hb, b"x" * 5000, 5000),  # two chunks in a row: one run
        ChannelEnded(hb),
    ]
    assert b.negotiated == Negotiated(10, 12)
    b.send_data(hb, b"answer")
    assert b.end_channel(hb) is True
    assert b.channel_count == 0
    # The server's init, then its response: the requester was ready, so no SessionReady.
    assert pump(b, a) == [DataReceived(ha, b"answer", 6), ChannelEnded(ha), ChannelClosed(ha)]
    assert a.negotiated == Negotiated(10, 12)
    assert not a.closed and not b.closed


def test_quick_init_allow_without_a_request_is_normal_negotiation() -> None:
    a = engine(streamux_quick_init="allow", streamux_id_bits=(1, 29, 8), streamux_length_bits=(6, 30, 10))
    b = engine()
    assert not a.ready
    handshake(a, b)
    assert a.negotiated == Negotiated(8, 10)


def _negotiation_fails_both_ways(a: StreamuxEngine, b: StreamuxEngine, needle: str) -> None:
    to_b, to_a = out(a), out(b)
    for e, data in ((b, to_b), (a, to_a)):
        with pytest.raises(NegotiationError) as info:
            e.receive_data(data)
        assert isinstance(info.value, ProtocolError)
        assert info.value.format == "streamux"
        assert str(info.value).startswith("streamux: negotiation failed: ")
        assert needle in str(info.value)
        assert e.closed
        assert not e.has_output  # nothing else is sent


def test_quick_init_against_a_server_that_does_not_allow_it() -> None:
    a = engine(streamux_quick_init="request")
    b = engine(streamux_quick_init="off")
    assert a.ready
    ha = a.open_channel()
    a.send_data(ha, b"too early")
    _negotiation_fails_both_ways(a, b, "quick init requested, but the other peer does not allow it")


def test_quick_init_requested_by_both() -> None:
    a = engine(streamux_quick_init="request")
    b = engine(streamux_quick_init="request")
    _negotiation_fails_both_ways(a, b, "both peers requested quick init")


def test_quick_init_with_values_the_server_does_not_support() -> None:
    # the spec's example: A's recommended length 16 is above B's max 15
    a = engine(streamux_quick_init="request", streamux_id_bits=(8, 15, 8), streamux_length_bits=(10, 18, 16))
    b = engine(streamux_quick_init="allow", streamux_id_bits=(6, 18, 10), streamux_length_bits=(8, 15, 10))
    _negotiation_fails_both_ways(a, b, "quick init length bits 16 outside the negotiated 10..15")


def test_quick_init_with_recommendations_over_30_bits_agrees_on_the_capped_widths() -> None:
    a = engine(streamux_quick_init="request", streamux_id_bits=(1, 29, 16), streamux_length_bits=(6, 30, 16))
    b = engine(streamux_quick_init="allow")
    ha = a.open_channel()
    a.send_data(ha, b"hello")
    a.end_channel(ha)
    events = pump(a, b)
    assert b.negotiated == Negotiated(15, 15)
    assert a.negotiated == b.negotiated  # the requester must precompute the capped widths
    hb = opened(events)
    assert events[2:] == [DataReceived(hb, b"hello", 5), ChannelEnded(hb)]
    assert pump(b, a) == []


def test_incompatible_ranges_fail_negotiation() -> None:
    # the spec's example: A's id max 8 < B's id min 10
    a = engine(streamux_id_bits=(6, 8, 8), streamux_length_bits=(5, 12, 12))
    b = engine(streamux_id_bits=(10, 15, 10), streamux_length_bits=(5, 15, 15))
    _negotiation_fails_both_ways(a, b, "id bits: max 8 < min 10")


def test_incompatible_length_ranges_fail_negotiation() -> None:
    a = engine(streamux_length_bits=(6, 10, 8))
    b = engine(streamux_length_bits=(12, 16, 14))
    _negotiation_fails_both_ways(a, b, "length bits: max 10 < min 12")


# -- request / response ------------------------------------------------------------------


def test_ids_start_at_the_random_id_then_count_up() -> None:
    a, _b = pair(a_id=5)
    handles = [a.open_channel() for _ in range(3)]
    assert [a.channel_name(x) for x in handles] == ["5", "6", "7"]
    assert len(set(handles)) == 3
    # the random value is taken modulo the id count, and the ids wrap
    a, _b = pair(a_id=(3 << 14) + 16383)
    handles = [a.open_channel() for _ in range(3)]
    assert [a.channel_name(x) for x in handles] == ["16383", "0", "1"]
    # a name given by the application stays local (Streamux has none on the wire)
    assert a.channel_name(a.open_channel("mine")) == "mine"
    assert not a.has_output


def test_send_data_chunks_and_end_sends_an_empty_termination() -> None:
    a, b = pair(send_frame=10)
    ha = a.open_channel()
    assert a.send_credit(ha) == flow.UNLIMITED  # no flow control on the wire
    assert not a.has_output  # opening sends nothing
    a.send_data(ha, b"0123456789abcdefghijKLMNO")  # 25 bytes
    data = out(a)
    # id 5, length 10, response 0, termination 0: (5 << 16 | 10) << 2 = 0x140028
    assert data == h("28001400") + b"0123456789" + h("28001400") + b"abcdefghij" + h("14001400") + b"KLMNO"
    assert decoded(DEFAULT, data) == [
        Chunk(5, False, False, b"0123456789"),
        Chunk(5, False, False, b"abcdefghij"),
        Chunk(5, False, False, b"KLMNO"),
    ]
    events = b.receive_data(data)
    hb = opened(events)
    assert norm(events) == [
        ChannelOpened(hb, "5"),
        DataReceived(hb, b"0123456789abcdefghijKLMNO", 25),  # three chunks: one run
    ]
    a.send_data(ha, b"")  # nothing (an empty non-final chunk would be a cancel)
    assert not a.has_output
    assert a.end_channel(ha) is False
    assert out(a) == h("01001400")  # id 5, length 0, termination
    assert a.end_channel(ha) is False  # once only
    assert not a.has_output
    assert a.send_credit(ha) == 0
    with pytest.raises(RuntimeError, match="streamux: cannot send on channel 5"):
        a.send_data(ha, b"late")
    assert feed(b, h("01001400")) == [ChannelEnded(hb)]


def test_request_and_response_then_the_id_is_free_again() -> None:
    a, b = pair(a_id=1, streamux_id_bits=(1, 1, 1))  # two ids: 1, then 0
    n = a.negotiated
    assert n == Negotiated(1, 16)
    ha = a.open_channel()
    a.send_data(ha, b"question")
    assert a.end_channel(ha) is False
    assert out(a) == hdr(n, 1, 8) + b"question" + hdr(n, 1, 0, term=True)
    assert b.receive_data(b"") == []
    events = feed(b, hdr(n, 1, 8) + b"question" + hdr(n, 1, 0, term=True))
    hb = opened(events)
    assert events == [ChannelOpened(hb, "1"), DataReceived(hb, b"question", 8), ChannelEnded(hb)]
    assert b.send_credit(hb) == flow.UNLIMITED
    b.send_data(hb, b"ans")
    b.send_data(hb, b"wer")
    assert b.end_channel(hb) is True  # both messages terminated: closed, forgotten
    assert not b.is_live(hb)
    assert b.channel_count == 0
    # the response: response bit 1, the same id
    response = hdr(n, 1, 3, resp=True) + b"ans" + hdr(n, 1, 3, resp=True) + b"wer"
    response += hdr(n, 1, 0, resp=True, term=True)
    assert out(b) == response
    assert feed(a, response) == [
        DataReceived(ha, b"answer", 6),
        ChannelEnded(ha),
        ChannelClosed(ha),
    ]
    assert a.channel_count == 0
    # id 0, then id 1 again
    h0, h1 = a.open_channel(), a.open_channel()
    assert (a.channel_name(h0), a.channel_name(h1)) == ("0", "1")


# -- a response waits for the end of its request ----------------------------------------


def test_a_response_waits_for_the_end_of_its_request() -> None:
    """No response chunk for request N goes out before N's terminating chunk came in (the
    spec's request-then-response flow; go-streamux fails the session otherwise): no send
    credit until then, and a CreditAvailable once the request ends."""
    a, b = pair()
    n = a.negotiated
    assert n is not None
    ha = a.open_channel()
    a.send_data(ha, b"stream")
    hb = opened(pump(a, b))
    assert b.send_credit(hb) == 0
    with pytest.raises(RuntimeError, match=r"streamux: cannot send the response on channel 5 .* before its"):
        b.send_data(hb, b"early")
    assert not b.has_output
    a.send_data(ha, b"more")
    assert pump(a, b) == [DataReceived(hb, b"more", 4)]
    assert b.send_credit(hb) == 0
    assert a.end_channel(ha) is False
    # the request's end: the response may go (the I/O layer asked for credit: it is told)
    assert pump(a, b) == [ChannelEnded(hb), CreditAvailable(hb)]
    assert b.send_credit(hb) == flow.UNLIMITED
    b.send_data(hb, b"answer")
    assert b.end_channel(hb) is True
    assert out(b) == hdr(n, 5, 6, resp=True) + b"answer" + hdr(n, 5, 0, resp=True, term=True)
    # a terminated single-chunk request may be answered at once
    hc = a.open_channel()
    a.send_data(hc, b"q")
    a.end_channel(hc)
    hd = opened(events := pump(a, b))
    assert events == [ChannelOpened(hd, "6"), DataReceived(hd, b"q", 1), ChannelEnded(hd)]
    assert b.send_credit(hd) == flow.UNLIMITED


def test_credit_available_only_when_it_was_asked_for() -> None:
    a, b = pair()
    ha, hb = served_request(a, b)
    a.end_channel(ha)
    assert pump(a, b) == [ChannelEnded(hb)]  # nobody waited for credit: no event


def test_an_early_end_of_the_response_goes_out_when_the_request_ends() -> None:
    a, b = pair()
    n = a.negotiated
    assert n is not None
    ha, hb = served_request(a, b, b"stream")
    assert b.end_channel(hb) is False  # held: not on the wire yet
    assert not b.has_output
    assert b.is_live(hb) and b.send_credit(hb) == 0
    assert b.end_channel(hb) is False  # once only
    a.send_data(ha, b"more")
    assert pump(a, b) == [DataReceived(hb, b"more", 4)]
    assert not b.has_output
    a.end_channel(ha)
    assert pump(a, b) == [ChannelEnded(hb), ChannelClosed(hb)]
    assert out(b) == hdr(n, 5, 0, resp=True, term=True)
    assert b.channel_count == 0
    assert feed(a, hdr(n, 5, 0, resp=True, term=True)) == [ChannelEnded(ha), ChannelClosed(ha)]


def test_a_response_ended_early_by_another_implementation_is_accepted() -> None:
    """polymux never answers early, but as the requester it takes such a response (the
    request may go on after it)."""
    a, b = pair()
    n = a.negotiated
    assert n is not None
    ha, hb = served_request(a, b, b"stream")
    assert feed(a, hdr(n, 5, 5, resp=True) + b"early" + hdr(n, 5, 0, resp=True, term=True)) == [
        DataReceived(ha, b"early", 5),
        ChannelEnded(ha),
    ]
    assert a.is_live(ha)
    a.send_data(ha, b"more")
    assert a.end_channel(ha) is True
    assert a.channel_count == 0
    assert pump(a, b) == [DataReceived(hb, b"more", 4), ChannelEnded(hb)]


def test_may_hold_bounds_held_responses() -> None:
    """``may_hold``: the writer of a held response goes on (True), up to
    streamux_response_hold per response and streamux_hold_budget per session."""
    a, b = pair(streamux_response_hold=100, streamux_hold_budget=150)
    handles = []
    for _ in range(3):
        h = a.open_channel()
        a.send_data(h, b"r")
        handles.append(h)
    events = pump(a, b)
    s1, s2, s3 = (e.channel for e in events if isinstance(e, ChannelOpened))
    assert a.may_hold(handles[0], 10**9) is False  # a request of ours: never held
    assert b.may_hold(s1, 80) is True
    assert b.may_hold(s1, 90) is True
    assert b.held_bytes == 90
    assert b.may_hold(s2, 50) is True
    assert b.held_bytes == 140
    with pytest.raises(LimitExceeded) as info:
        b.may_hold(s3, 20)  # 160 in all
    assert str(info.value) == (
        "streamux: the response to request 7 cannot be sent before the request ends, and it holds "
        "more while the request is still arriving: 160 bytes held by the session's responses "
        "exceed streamux_hold_budget=150 (raise it)"
    )
    assert b.held_bytes == 140
    over = r"101 bytes exceed streamux_response_hold=100 \(raise it, or read the whole request before answering\)$"
    with pytest.raises(LimitExceeded, match=over):
        b.may_hold(s1, 101)
    assert b.held_bytes == 50  # s1's no longer count (the I/O layer resets it)
    b.reset_channel(s1)
    # the request's end releases what it held: the response is sendable now
    a.end_channel(handles[1])
    pump(a, b)
    assert b.held_bytes == 0
    assert b.may_hold(s2, 10**9) is False
    b.reset_channel(s3)
    assert b.held_bytes == 0


def test_early_responses_a_polymux_extension() -> None:
    """``streamux_early_responses=True``: the responder answers while the request is still
    arriving (a conversation on one channel; go-streamux rejects it)."""
    a = engine(5)
    b = engine(5, streamux_early_responses=True)
    handshake(a, b)
    n = a.negotiated
    assert n is not None
    ha, hb = served_request(a, b, b"offer")
    assert b.send_credit(hb) == flow.UNLIMITED
    assert b.may_hold(hb, 10**9) is False
    b.send_data(hb, b"accept")
    assert b.end_channel(hb) is False
    assert out(b) == hdr(n, 5, 6, resp=True) + b"accept" + hdr(n, 5, 0, resp=True, term=True)
    a.send_data(ha, b"more")
    assert a.end_channel(ha) is False
    assert pump(a, b) == [DataReceived(hb, b"more", 4), ChannelEnded(hb), ChannelClosed(hb)]
    with pytest.raises(ValueError, match="early_responses must be a bool, got 'yes'"):
        StreamuxOptions(early_responses="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="given as SessionConfig streamux_early_responses"):
        StreamuxEngine(SessionConfig(streamux_early_responses="yes"))  # type: ignore[arg-type]


def test_hold_is_released_when_the_request_is_cancelled() -> None:
    a, b = pair()
    ha, hb = served_request(a, b)
    assert b.may_hold(hb, 1000) is True
    a.reset_channel(ha)
    assert pump(a, b) == [ChannelReset(hb, "request cancelled by the peer")]
    assert b.held_bytes == 0
    assert b.may_hold(hb, 1000) is False  # forgotten


def test_large_data_is_split_at_the_negotiated_length() -> None:
    a, b = pair(streamux_length_bits=(6, 12, 12))  # 4095-byte chunks
    n = a.negotiated
    assert n is not None
    ha = a.open_channel()
    payload = bytes(i % 251 for i in range(10000))
    a.send_data(ha, payload)
    data = out(a)
    chunks = decoded(n, data)
    assert [len(c.payload) for c in chunks] == [4095, 4095, 1810]
    assert {(c.id, c.response, c.termination) for c in chunks} == {(5, False, False)}
    events = feed(b, data)
    hb = opened(events)
    assert (
        b"".join(bytes(e.data) for e in events if isinstance(e, DataReceived) and e.channel == hb) == payload
    )


def test_interleaved_chunks_reach_the_right_requests() -> None:
    a, b = pair(send_frame=3)
    hs = [a.open_channel() for _ in range(3)]  # ids 5, 6, 7
    a.send_data(hs[0], b"aaaa")
    a.send_data(hs[1], b"bb")
    a.send_data(hs[2], b"c")
    a.send_data(hs[1], b"BBBB")
    a.end_channel(hs[2])
    a.send_data(hs[0], b"AA")
    a.end_channel(hs[0])
    a.end_channel(hs[1])
    data = out(a)
    assert [(c.id, c.payload) for c in decoded(a.negotiated, data)] == [  # type: ignore[arg-type]
        (5, b"aaa"),
        (5, b"a"),
        (6, b"bb"),
        (7, b"c"),
        (6, b"BBB"),
        (6, b"B"),
        (7, b""),
        (5, b"AA"),
        (5, b""),
        (6, b""),
    ]
    events = feed(b, data)
    by_id: dict[str, int] = {e.name: e.channel for e in events if isinstance(e, ChannelOpened)}
    assert set(by_id) == {"5", "6", "7"}
    got: dict[str, bytes] = {}
    ended: list[str] = []
    names = {handle: name for name, handle in by_id.items()}
    for e in events:
        if isinstance(e, DataReceived):
            got[names[e.channel]] = got.get(names[e.channel], b"") + bytes(e.data)
        elif isinstance(e, ChannelEnded):
            ended.append(names[e.channel])
    assert got == {"5": b"aaaaAA", "6": b"bbBBBB", "7": b"c"}
    assert ended == ["7", "5", "6"]
    # the responses, interleaved the other way round
    b.send_data(by_id["7"], b"seven")
    b.send_data(by_id["6"], b"six")
    b.end_channel(by_id["5"])
    b.send_data(by_id["7"], b"!")
    b.end_channel(by_id["6"])
    b.end_channel(by_id["7"])
    events = pump(b, a)
    assert events == [
        DataReceived(hs[2], b"seven", 5),  # two chunks in a row: one run
        DataReceived(hs[1], b"six", 3),
        ChannelEnded(hs[0]),
        ChannelClosed(hs[0]),
        DataReceived(hs[2], b"!", 1),
        ChannelEnded(hs[1]),
        ChannelClosed(hs[1]),
        ChannelEnded(hs[2]),
        ChannelClosed(hs[2]),
    ]
    assert a.channel_count == b.channel_count == 0


def test_ids_are_scoped_per_sender() -> None:
    a, b = pair(a_id=9, b_id=9)
    ha = a.open_channel()
    hb = b.open_channel()
    a.send_data(ha, b"from a")
    b.send_data(hb, b"from b")
    a.end_channel(ha)
    b.end_channel(hb)
    to_b, to_a = out(a), out(b)
    n = a.negotiated
    assert n is not None
    assert to_b[:4] == hdr(n, 9, 6) and to_a[:4] == hdr(n, 9, 6)  # both requests use id 9
    events_b = feed(b, to_b)
    events_a = feed(a, to_a)
    served_b, served_a = opened(events_b), opened(events_a)
    assert served_b != hb and served_a != ha
    assert events_b[1:] == [DataReceived(served_b, b"from a", 6), ChannelEnded(served_b)]
    assert events_a[1:] == [DataReceived(served_a, b"from b", 6), ChannelEnded(served_a)]
    # b answers a's request 9 while its own request 9 waits for its answer, and vice versa
    b.send_data(served_b, b"b answers")
    a.send_data(served_a, b"a answers")
    assert pump(b, a) == [DataReceived(ha, b"b answers", 9)]
    assert pump(a, b) == [DataReceived(hb, b"a answers", 9)]
    assert a.end_channel(served_a) is True
    assert b.end_channel(served_b) is True
    assert pump(a, b) == [ChannelEnded(hb), ChannelClosed(hb)]
    assert pump(b, a) == [ChannelEnded(ha), ChannelClosed(ha)]
    assert a.channel_count == b.channel_count == 0


def test_all_ids_in_flight() -> None:
    a, b = pair(a_id=0, streamux_id_bits=(1, 1, 1))
    h0, h1 = a.open_channel(), a.open_channel()
    assert (a.channel_name(h0), a.channel_name(h1)) == ("0", "1")
    with pytest.raises(RuntimeError, match=r"streamux: all 2 request ids are in flight \(1-bit ids\)"):
        a.open_channel()
    with pytest.raises(RuntimeError, match="all 2 request ids"):
        a.ping()
    # the peer's ids are its own: b can still open both of its ids
    b.open_channel()
    b.open_channel()
    # finishing request 1 frees id 1
    a.send_data(h1, b"x")
    a.end_channel(h1)
    served = opened(pump(a, b))
    b.end_channel(served)
    assert pump(b, a) == [ChannelEnded(h1), ChannelClosed(h1)]
    assert a.channel_name(a.open_channel()) == "1"


def test_zero_id_bits_allow_one_request_at_a_time() -> None:
    a, b = pair(a_id=77, streamux_id_bits=(0, 0, 0), streamux_length_bits=(1, 6, 6))
    assert a.negotiated == Negotiated(0, 6)  # a one-byte header: llllllrt
    ha = a.open_channel()
    with pytest.raises(RuntimeError, match="all 1 request ids"):
        a.open_channel()
    a.send_data(ha, b"x" * 70)
    a.end_channel(ha)
    data = out(a)
    assert data[:1] == h("fc")  # length 63
    assert data[64:65] == h("1c")  # length 7
    assert data[-1:] == h("01")  # empty termination
    served = opened(feed(b, data))
    b.end_channel(served)
    assert out(b) == h("03")  # empty response: response and termination
    assert a.receive_data(h("03")) == [ChannelEnded(ha), ChannelClosed(ha)]
    a.open_channel()


# -- cancel ------------------------------------------------------------------------------


def test_cancel_locks_the_id_until_the_ack_and_drops_late_responses() -> None:
    a, b = pair(a_id=0, streamux_id_bits=(1, 1, 1))
    n = a.negotiated
    assert n == Negotiated(1, 16)
    h0 = a.open_channel()
    a.send_data(h0, b"req")
    a.end_channel(h0)
    served = opened(pump(a, b))
    # b answers before it learns about the cancel
    b.send_data(served, b"partial")
    late = out(b)
    a.reset_channel(h0)
    cancel = out(a)
    assert cancel == hdr(n, 0, 0)  # cancel: length 0, response 0, termination 0
    assert not a.is_live(h0)
    with pytest.raises(KeyError, match="streamux"):
        a.send_data(h0, b"more")
    a.reset_channel(h0)  # a second reset does nothing
    assert not a.has_output
    # id 0 is locked: the next request takes 1, then there is none
    h1 = a.open_channel()
    assert a.channel_name(h1) == "1"
    with pytest.raises(RuntimeError, match="all 2 request ids"):
        a.open_channel()
    # the late response is discarded silently
    assert a.receive_data(late) == []
    b.send_data(served, b"rest")
    assert a.receive_data(out(b)) == []
    assert not a.closed
    # b learns about the cancel, resets its side and acks
    a.send_data(h1, b"other")
    events = feed(b, cancel + out(a))
    assert events[0] == ChannelReset(served, "request cancelled by the peer")
    assert not b.is_live(served)
    served1 = opened(events)
    assert events[1:] == [ChannelOpened(served1, "1"), DataReceived(served1, b"other", 5)]
    assert out(b) == hdr(n, 0, 0, resp=True)  # cancel ack: length 0, response 1, termination 0
    with pytest.raises(KeyError):
        b.send_data(served, b"too late")
    # the ack unlocks id 0
    assert a.receive_data(hdr(n, 0, 0, resp=True)) == []
    h2 = a.open_channel()
    assert a.channel_name(h2) == "0"
    # and a response to the new request 0 is delivered again
    a.send_data(h2, b"again")
    a.end_channel(h2)
    served2 = opened(pump(a, b))
    b.send_data(served2, b"fresh")
    assert pump(b, a) == [DataReceived(h2, b"fresh", 5)]


def test_cancel_before_anything_was_sent_is_acked() -> None:
    a, b = pair(a_id=3)
    ha = a.open_channel()
    a.reset_channel(ha)
    n = a.negotiated
    assert n is not None
    assert out(a) == hdr(n, 3, 0)
    assert feed(b, hdr(n, 3, 0)) == []  # no request 3 known: no event ...
    assert out(b) == hdr(n, 3, 0, resp=True)  # ... but an ack all the same
    assert a.receive_data(hdr(n, 3, 0, resp=True)) == []
    assert a.channel_count == b.channel_count == 0


def test_cancel_for_an_unknown_request_is_still_acked() -> None:
    b = engine()
    b.receive_data(DEFAULT_INIT)
    out(b)
    for cid in (0, 9, 16383):
        assert b.receive_data(hdr(DEFAULT, cid, 0)) == []
        assert out(b) == hdr(DEFAULT, cid, 0, resp=True)
    assert not b.closed


def test_cancel_after_the_request_ended_resets_the_servers_response() -> None:
    a, b = pair()
    ha = a.open_channel()
    a.send_data(ha, b"q")
    a.end_channel(ha)
    served = opened(pump(a, b))
    b.send_data(served, b"half an answer")
    assert pump(b, a) == [DataReceived(ha, b"half an answer", 14)]
    a.reset_channel(ha)
    assert pump(a, b) == [ChannelReset(served, "request cancelled by the peer")]
    assert b.channel_count == 0
    assert pump(b, a) == []  # the ack
    assert a.channel_count == 0


def test_cancel_after_the_response_completed_is_acked() -> None:
    a, b = pair()
    ha = a.open_channel()
    a.send_data(ha, b"q")
    served = opened(pump(a, b))
    b.end_channel(served)  # held until the request ends
    assert not b.has_output
    # another implementation may end its response early
    assert feed(a, hdr(DEFAULT, 5, 0, resp=True, term=True)) == [ChannelEnded(ha)]
    a.reset_channel(ha)  # the request was not terminated: cancel it
    assert pump(a, b) == [ChannelReset(served, "request cancelled by the peer")]
    assert out(b) == hdr(DEFAULT, 5, 0, resp=True)  # the ack only: the held end is dropped
    assert a.channel_count == b.channel_count == 0
    # once closed, a reset does nothing
    hc = a.open_channel()
    a.send_data(hc, b"q")
    a.end_channel(hc)
    served = opened(pump(a, b))
    b.end_channel(served)
    assert pump(b, a) == [ChannelEnded(hc), ChannelClosed(hc)]
    a.reset_channel(hc)
    assert not a.has_output


def test_responder_reset_ends_the_response_and_drops_the_request() -> None:
    a, b = pair()
    n = a.negotiated
    assert n is not None
    ha = a.open_channel()
    a.send_data(ha, b"first")
    served = opened(pump(a, b))
    b.reset_channel(served, "cannot say why")
    # Streamux cannot carry a reset from the responder: the response just ends, once the
    # request has ended
    assert not b.has_output
    b.reset_channel(served)  # again: nothing
    assert not b.has_output
    # The engine still knows request 5 (so that its further chunks are not a new
    # request), but the application hears nothing more of it.
    assert b.is_live(served)
    a.send_data(ha, b"more request")
    assert pump(a, b) == []  # dropped silently
    assert not b.has_output
    assert a.end_channel(ha) is False
    assert pump(a, b) == []
    assert not b.is_live(served)
    assert out(b) == hdr(n, 5, 0, resp=True, term=True)
    assert feed(a, hdr(n, 5, 0, resp=True, term=True)) == [
        ChannelEnded(ha),  # the requester sees a plain end (an empty response)
        ChannelClosed(ha),
    ]
    assert a.channel_count == b.channel_count == 0
    assert not a.closed and not b.closed


def test_responder_reset_after_the_request_ended_ends_the_response_at_once() -> None:
    a, b = pair()
    n = a.negotiated
    assert n is not None
    ha = a.open_channel()
    a.send_data(ha, b"first")
    a.end_channel(ha)
    served = opened(pump(a, b))
    b.send_data(served, b"some")
    b.reset_channel(served, "cannot say why")
    assert out(b) == hdr(n, 5, 4, resp=True) + b"some" + hdr(n, 5, 0, resp=True, term=True)
    assert not b.is_live(served)
    assert feed(a, hdr(n, 5, 4, resp=True) + b"some" + hdr(n, 5, 0, resp=True, term=True)) == [
        DataReceived(ha, b"some", 4),
        ChannelEnded(ha),
        ChannelClosed(ha),
    ]


def test_reject_before_the_request_ended_answers_when_it_ends() -> None:
    a, b = pair()
    n = a.negotiated
    assert n is not None
    ha, served = served_request(a, b, b"unwanted")
    b.reject_channel(served)
    assert not b.has_output
    a.send_data(ha, b" and more")
    a.end_channel(ha)
    assert pump(a, b) == []
    assert out(b) == hdr(n, 5, 0, resp=True, term=True)
    assert b.channel_count == 0


def test_reject_is_an_empty_response() -> None:
    a, b = pair()
    n = a.negotiated
    assert n is not None
    ha = a.open_channel()
    a.send_data(ha, b"unwanted")
    a.end_channel(ha)
    served = opened(pump(a, b))
    b.reject_channel(served)
    assert out(b) == hdr(n, 5, 0, resp=True, term=True)
    assert b.channel_count == 0
    assert a.receive_data(hdr(n, 5, 0, resp=True, term=True)) == [ChannelEnded(ha), ChannelClosed(ha)]


def test_cancel_of_a_dropped_request_is_acked_without_an_event() -> None:
    a, b = pair()
    ha = a.open_channel()
    a.send_data(ha, b"x")
    served = opened(pump(a, b))
    b.reset_channel(served)
    a.reset_channel(ha)
    assert pump(a, b) == []
    assert b.channel_count == 0
    assert out(b) == hdr(DEFAULT, 5, 0, resp=True)  # the ack (the held end is dropped)
    assert a.channel_count == 0
    assert a.channel_name(a.open_channel()) == "6"


# -- ping and empty requests -------------------------------------------------------------


def test_ping_is_an_empty_request_answered_with_an_empty_response() -> None:
    a, b = pair(a_id=3)
    n = a.negotiated
    assert n is not None
    a.now = 10.0
    cid = a.ping()
    assert cid == 3
    assert out(a) == hdr(n, 3, 0, term=True)  # length 0, response 0, termination 1
    assert feed(b, hdr(n, 3, 0, term=True)) == []  # no ChannelOpened
    assert b.channel_count == 0
    assert out(b) == hdr(n, 3, 0, resp=True, term=True)  # the ping ack
    # the ping's id is in flight until the ack
    assert a.channel_name(a.open_channel()) == "4"
    b.now = 99.0  # the answering side's clock does not matter
    a.now = 10.25
    assert a.receive_data(hdr(n, 3, 0, resp=True, term=True)) == [PingAcked(3)]
    assert a.rtt == 0.25
    assert b.rtt is None
    # two pings in flight get two ids
    a.now = 20.0
    p1, p2 = a.ping(), a.ping()
    assert (p1, p2) == (5, 6)
    pump(a, b)
    a.now = 20.5
    assert pump(b, a) == [PingAcked(5), PingAcked(6)]
    assert a.rtt == 0.5


def test_ping_ack_with_data_is_a_protocol_error() -> None:
    a, _b = pair()
    n = a.negotiated
    assert n is not None
    cid = a.ping()
    assert_protocol_error(a, hdr(n, cid, 2, resp=True, term=True) + b"no", f"response to request {cid}")


def test_pings_with_one_bit_ids_use_up_ids() -> None:
    a, b = pair(a_id=0, streamux_id_bits=(1, 1, 1))
    a.ping()
    a.open_channel()
    with pytest.raises(RuntimeError, match="in flight"):
        a.ping()
    pump(a, b)
    assert pump(b, a) == [PingAcked(0)]
    assert a.ping() == 0


def test_an_empty_request_is_a_ping_on_the_wire() -> None:
    a, b = pair()
    n = a.negotiated
    assert n is not None
    ha = a.open_channel()
    a.send_data(ha, b"")
    assert a.end_channel(ha) is False
    assert out(a) == hdr(n, 5, 0, term=True)  # the same bytes as a ping
    # the server cannot tell: no ChannelOpened, an empty response at once
    assert feed(b, hdr(n, 5, 0, term=True)) == []
    assert out(b) == hdr(n, 5, 0, resp=True, term=True)
    # the requester sees an empty answer
    assert a.receive_data(hdr(n, 5, 0, resp=True, term=True)) == [ChannelEnded(ha), ChannelClosed(ha)]
    assert a.channel_count == b.channel_count == 0


# -- protocol errors ---------------------------------------------------------------------


def negotiated_small() -> StreamuxEngine:
    """An engine that negotiated 8-bit ids and 12-bit lengths (3-byte headers)."""
    _a, b = pair(**SMALL)
    assert b.negotiated == Negotiated(8, 12)
    return b


def test_cancel_ack_for_an_id_not_cancelled() -> None:
    b = negotiated_small()
    assert_protocol_error(
        b, hdr(Negotiated(8, 12), 7, 0, resp=True), r"cancel ack for request 7\b", "did not cancel"
    )


def test_cancel_ack_after_the_ack() -> None:
    a, b = pair(**SMALL)
    n = a.negotiated
    assert n is not None
    ha = a.open_channel()
    a.reset_channel(ha)
    pump(a, b)
    ack = out(b)
    assert a.receive_data(ack) == []
    assert_protocol_error(a, ack, "cancel ack for request 5")


def test_response_to_an_unknown_request() -> None:
    b = negotiated_small()
    assert_protocol_error(
        b, hdr(Negotiated(8, 12), 7, 3, resp=True) + b"abc", r"response to request 7\b", "never sent"
    )


def test_empty_response_to_an_unknown_request() -> None:
    b = negotiated_small()
    assert_protocol_error(b, hdr(Negotiated(8, 12), 200, 0, resp=True, term=True), "response to request 200")


def test_response_to_a_completed_request() -> None:
    a, b = pair()
    ha = a.open_channel()
    a.send_data(ha, b"q")
    a.end_channel(ha)
    served = opened(pump(a, b))
    b.end_channel(served)
    assert pump(b, a) == [ChannelEnded(ha), ChannelClosed(ha)]
    assert_protocol_error(a, hdr(DEFAULT, 5, 1, resp=True) + b"!", "response to request 5")


def test_response_continued_after_its_termination() -> None:
    a, b = pair()
    ha = a.open_channel()
    a.send_data(ha, b"q")  # the request stays open: the record lives on
    opened(pump(a, b))
    assert feed(a, hdr(DEFAULT, 5, 0, resp=True, term=True)) == [ChannelEnded(ha)]  # answered early
    assert_protocol_error(a, hdr(DEFAULT, 5, 1, resp=True) + b"!", "response to request 5 continued after")


def test_request_continued_after_its_termination() -> None:
    b = negotiated_small()
    n = Negotiated(8, 12)
    events = b.receive_data(hdr(n, 4, 2) + b"hi" + hdr(n, 4, 0, term=True))
    assert [type(e) for e in events] == [ChannelOpened, DataReceived, ChannelEnded]
    assert_protocol_error(b, hdr(n, 4, 1) + b"!", r"request 4 continued after its termination")


def test_request_continued_after_a_single_chunk_message() -> None:
    b = negotiated_small()
    n = Negotiated(8, 12)
    b.receive_data(hdr(n, 4, 2, term=True) + b"hi")
    assert_protocol_error(b, hdr(n, 4, 0, term=True), r"request 4 continued")


@pytest.mark.parametrize("bit", [22, 23])
def test_header_with_unused_high_bits_set(bit: int) -> None:
    b = negotiated_small()
    value = 1 << bit | (5 << 12 | 3) << 2  # id 5, length 3, plus an unused bit
    assert_protocol_error(
        b, value.to_bytes(3, "little") + b"abc", "unused high bits set", "id 8 bits, length 12 bits"
    )


def test_a_length_over_the_negotiated_width_cannot_be_encoded() -> None:
    n = Negotiated(8, 12)
    with pytest.raises(ValueError, match="length 4096 does not fit 12 bits"):
        wire.encode_header(n, 255, 4096, False, False)
    with pytest.raises(ValueError, match="id 256 does not fit 8 bits"):
        wire.encode_header(n, 256, 1, False, False)
    # written anyway, the length spills into the id and past it: unused bits
    b = negotiated_small()
    value = ((255 << 12) + 4096 + 10) << 2
    assert value >> 22 == 1
    assert_protocol_error(b, value.to_bytes(3, "little"), "unused high bits set")


def test_init_with_reserved_bits_set() -> None:
    b = engine()
    word = int.from_bytes(DEFAULT_INIT[1:], "big") | 1 << 31
    assert_protocol_error(b, b"\x01" + word.to_bytes(4, "big"), "reserved bits set")
    b = engine()
    word = int.from_bytes(DEFAULT_INIT[1:], "big") | 1 << 30
    assert_protocol_error(b, b"\x01" + word.to_bytes(4, "big"), "reserved bits set: 0x1")


def test_version_mismatch() -> None:
    b = engine()
    err = assert_protocol_error(b, b"\x02" + DEFAULT_INIT[1:], "protocol versions differ: 1 and 2")
    assert isinstance(err, NegotiationError)
    b = engine()
    err = assert_protocol_error(b, b"\x00" + DEFAULT_INIT[1:], "protocol version 0 is out of range")
    assert isinstance(err, NegotiationError)


@pytest.mark.parametrize(
    ("theirs", "needle"),
    [
        (InitMessage(id_min=8, id_max=4, id_rec=6), "id max bits 4 < min bits 8"),
        (InitMessage(length_rec=5), "length recommended bits 5 is outside 6..30"),
        (InitMessage(length_min=0, length_rec=16), r"length min bits 0 is out of range"),
        (
            InitMessage(quick_request=True, quick_allowed=True),
            "both quick init request and quick init allowed",
        ),
        (InitMessage(quick_request=True, id_rec=31), "quick init request uses the wildcard for id bits"),
    ],
)
def test_invalid_init_from_the_peer(theirs: InitMessage, needle: str) -> None:
    b = engine()
    err = assert_protocol_error(b, wire.encode_init(theirs), re.escape(needle))
    assert isinstance(err, NegotiationError)


def test_chunk_data_with_the_init_does_not_hide_an_error() -> None:
    b = negotiated_small()
    n = Negotiated(8, 12)
    # good chunks first; the error in the same read still ends the session
    with pytest.raises(ProtocolError, match="cancel ack for request 1"):
        b.receive_data(hdr(n, 2, 1) + b"x" + hdr(n, 1, 0, resp=True))
    assert b.closed


@pytest.mark.parametrize(
    ("tail", "pending"),
    [
        (h("14"), 1),  # one byte of a 4-byte header
        (h("140014"), 3),
        (h("14001400") + b"abc", 7),  # id 5, length 5: the header and 3 of 5 bytes
    ],
)
def test_eof_inside_a_chunk(tail: bytes, pending: int) -> None:
    a, b = pair()
    ha = a.open_channel()
    a.send_data(ha, b"complete")
    assert [type(e) for e in pump(a, b)] == [ChannelOpened, DataReceived]
    # What arrived of a chunk's body is delivered at once (memory does not grow with the
    # negotiated chunk length); the EOF is still a protocol error.
    events = b.receive_data(tail)
    assert [type(e) for e in events] == ([DataReceived] if pending > 4 else [])
    with pytest.raises(ProtocolError, match=rf"^streamux: connection ended inside a chunk \({pending} bytes"):
        b.receive_eof()
    assert b.closed


def test_eof_inside_the_init_message() -> None:
    b = engine()
    b.receive_data(DEFAULT_INIT[:3])
    with pytest.raises(ProtocolError, match=r"^streamux: connection ended inside a chunk \(3 bytes"):
        b.receive_eof()


def test_eof_inside_the_init_message_of_a_quick_init_requester() -> None:
    a = engine(streamux_quick_init="request")
    a.receive_data(DEFAULT_INIT[:3])
    with pytest.raises(ProtocolError, match="connection ended inside"):
        a.receive_eof()


def test_eof_between_chunks_is_clean() -> None:
    a, b = pair()
    ha = a.open_channel()
    a.send_data(ha, b"x")
    pump(a, b)
    b.receive_eof()
    assert b.closed
    with pytest.raises(ProtocolError, match="after the session ended"):
        b.receive_data(b"")
    e = engine()
    e.receive_eof()  # nothing received at all
    assert e.closed


# -- random interleavings ----------------------------------------------------------------


@dataclass(eq=False)
class Served:
    """A request as its responder sees it."""

    handle: int
    cid: int
    got: bytearray = field(default_factory=bytearray)
    got_end: bool = False
    sent: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset_by_peer: bool = False
    dropped: bool = False
    closed: bool = False
    request: Request | None = None

    @property
    def writable(self) -> bool:
        return not (self.ended or self.reset_by_peer or self.dropped or self.closed)


@dataclass(eq=False)
class Request:
    """A request as its requester sees it."""

    handle: int
    cid: int
    sent: bytearray = field(default_factory=bytearray)
    ended: bool = False
    cancelled: bool = False
    got: bytearray = field(default_factory=bytearray)
    got_end: bool = False
    closed: bool = False
    served: Served | None = None

    @property
    def writable(self) -> bool:
        return not (self.ended or self.cancelled or self.closed)


class WireOrder:
    """Checks one side's output against its input, chunk by chunk: no response chunk for
    the peer's request N (data or termination; a cancel ack is not one) goes out while N
    is still open, i.e. before its terminating chunk came in."""

    def __init__(self, n: Negotiated) -> None:
        self.inbound = wire.Decoder(n)
        self.outbound = wire.Decoder(n)
        self.skip = {"in": wire.INIT_SIZE, "out": wire.INIT_SIZE}  # the initialize messages
        self.open: set[int] = set()  # the peer's requests still arriving
        self.responses = 0

    def _strip(self, way: str, data: bytes) -> bytes:
        k = min(self.skip[way], len(data))
        self.skip[way] -= k
        return data[k:]

    def received(self, data: bytes) -> None:
        for c in self.inbound.feed(self._strip("in", data)):
            if c.response:
                continue
            if c.termination or not c.payload:  # the end, a ping, or a cancel
                self.open.discard(c.id)
            else:
                self.open.add(c.id)

    def sent(self, data: bytes) -> None:
        for c in self.outbound.feed(self._strip("out", data)):
            if c.response and (c.payload or c.termination):
                assert c.id not in self.open, f"response chunk for request {c.id} before its end"
                self.responses += 1


@dataclass(eq=False)
class Side:
    engine: StreamuxEngine
    requests: dict[int, Request] = field(default_factory=dict)
    served: dict[int, Served] = field(default_factory=dict)
    history: list[Request] = field(default_factory=list)
    pings: set[int] = field(default_factory=set)
    unsent: bytearray = field(default_factory=bytearray)
    """What this side sent that the other has not received yet."""
    order: WireOrder = field(default_factory=lambda: WireOrder(Negotiated(2, 4)))


class World:
    """Two engines, a model of what each request and response carried, and checks."""

    def __init__(self, split: int) -> None:
        config = {"streamux_id_bits": (2, 2, 2), "streamux_length_bits": (4, 4, 4)}  # 1-byte headers
        self.a = Side(engine(1, **config))
        self.b = Side(engine(1, **config))
        self.split = split
        self.counter = 0
        for side in (self.a, self.b):
            self.collect(side)
        self.deliver(self.a, 0)
        self.deliver(self.b, 0)
        assert self.a.engine.ready and self.b.engine.ready
        assert self.a.engine.max_frame == 15

    def other(self, side: Side) -> Side:
        return self.b if side is self.a else self.a

    def data(self, n: int) -> bytes:
        self.counter += 1
        return bytes((self.counter * 7 + i) % 256 for i in range(n))

    def collect(self, side: Side) -> None:
        data = out(side.engine)
        side.order.sent(data)
        side.unsent += data

    # -- commands --------------------------------------------------------------------------

    def open(self, side: Side, size: int) -> None:
        """Open a request and write ``size`` bytes to it."""
        e = side.engine
        try:
            handle = e.open_channel()
        except RuntimeError:
            assert (
                sum(local for local, _ in e._by_wire) + len(e._locked) + len(e._pings) == 4
            )  # every id is taken
            return
        request = Request(handle, int(e.channel_name(handle)))
        side.requests[handle] = request
        side.history.append(request)
        data = self.data(size)
        e.send_data(handle, data)
        request.sent += data
        self.collect(side)

    def ping(self, side: Side) -> None:
        try:
            side.pings.add(side.engine.ping())
        except RuntimeError:
            assert (
                sum(local for local, _ in side.engine._by_wire)
                + len(side.engine._locked)
                + len(side.engine._pings)
                == 4
            )
        self.collect(side)

    def write(self, side: Side, index: int, size: int) -> None:
        requests = [r for r in side.requests.values() if r.writable]
        served = [s for s in side.served.values() if s.writable and s.got_end]  # answers wait
        targets: list[Request | Served] = [*requests, *served]
        if not targets:
            return
        target = targets[index % len(targets)]
        data = self.data(size)
        side.engine.send_data(target.handle, data)
        target.sent += data
        self.collect(side)

    def end(self, side: Side, index: int) -> None:
        targets: list[Request | Served] = [
            *(r for r in side.requests.values() if r.writable),
            *(s for s in side.served.values() if s.writable),
        ]
        if not targets:
            return
        target = targets[index % len(targets)]
        closed = side.engine.end_channel(target.handle)
        target.ended = True
        if closed:
            assert target.got_end
            target.closed = True
        self.collect(side)

    def cancel(self, side: Side, index: int) -> None:
        targets = [r for r in side.requests.values() if not (r.cancelled or r.closed)]
        if not targets:
            return
        target = targets[index % len(targets)]
        side.engine.reset_channel(target.handle)
        target.cancelled = True
        self.collect(side)

    def drop(self, side: Side, index: int) -> None:
        targets = [s for s in side.served.values() if not (s.reset_by_peer or s.dropped or s.closed)]
        if not targets:
            return
        target = targets[index % len(targets)]
        side.engine.reset_channel(target.handle)
        target.dropped = True
        self.collect(side)

    def deliver(self, side: Side, size: int) -> None:
        """Move ``size`` bytes (0: all, else at most ``split``) of ``side``'s output over."""
        other = self.other(side)
        n = len(side.unsent) if size == 0 else min(size, self.split, len(side.unsent))
        data = bytes(side.unsent[:n])
        del side.unsent[:n]
        other.order.received(data)
        for event in other.engine.receive_data(data):
            self.on_event(other, event)
        self.collect(other)

    # -- events ----------------------------------------------------------------------------

    def on_event(self, side: Side, event: Event) -> None:
        if isinstance(event, SessionReady):
            return
        if isinstance(event, PingAcked):
            side.pings.remove(event.opaque)
            return
        handle = event.channel  # type: ignore[attr-defined]
        if isinstance(event, ChannelOpened):
            assert handle not in side.served
            if side.engine.is_live(handle):  # a cancel in the same read may follow
                side.engine.accept_channel(handle)
            served = Served(handle, int(event.name))
            candidates = [
                r
                for r in self.other(side).history
                if r.cid == served.cid and r.served is None and r.sent and not r.closed
            ]
            request = candidates[-1]
            request.served, served.request = served, request
            side.served[handle] = served
            return
        target: Request | Served
        if handle in side.served:
            target = side.served[handle]
            assert not (target.dropped or target.reset_by_peer or target.closed), event
        else:
            target = side.requests[handle]
            assert not (target.cancelled or target.closed), event
        if isinstance(event, DataReceived):
            assert not target.got_end
            body = bytes(event.data) + b"".join(bytes(part) for part in event.more)  # a run
            assert event.flow_controlled_length == len(body) > 0
            target.got += body
        elif isinstance(event, ChannelEnded):
            assert not target.got_end
            target.got_end = True
        elif isinstance(event, ChannelClosed):
            assert target.got_end and target.ended
            target.closed = True
        elif isinstance(event, ChannelReset):
            assert isinstance(target, Served)
            assert event.message == "request cancelled by the peer"
            target.reset_by_peer = True
        else:  # pragma: no cover
            pytest.fail(f"unexpected event {event}")
        self.check_prefixes()

    def check_prefixes(self) -> None:
        for side in (self.a, self.b):
            for request in side.history:
                served = request.served
                if served is None:
                    assert request.got == b""
                    continue
                assert request.sent.startswith(served.got)
                assert served.sent.startswith(request.got)

    # -- the end ---------------------------------------------------------------------------

    def drain(self) -> None:
        """End every message still open, deliver everything, until nothing moves."""
        for _ in range(20):
            for side in (self.a, self.b):
                for request in list(side.requests.values()):
                    if request.writable:
                        self.end(side, [r for r in side.requests.values() if r.writable].index(request))
                for served in list(side.served.values()):
                    if served.writable:
                        if side.engine.end_channel(served.handle):
                            assert served.got_end
                            served.closed = True
                        served.ended = True
                        self.collect(side)
            if not self.a.unsent and not self.b.unsent:
                return
            self.deliver(self.a, 0)
            self.deliver(self.b, 0)
        raise AssertionError("the engines never went quiet")  # pragma: no cover

    def check(self) -> None:
        for side in (self.a, self.b):
            e = side.engine
            assert not e.closed
            assert e.channel_count == 0
            assert not e._locked and not e._pings and not side.pings
            assert e._decoder is not None and e._decoder.pending == 0
            for request in side.history:
                served = request.served
                if request.cancelled:
                    continue
                assert request.closed and request.got_end
                if served is None:
                    assert request.sent == b"" and request.got == b""  # an empty request: a ping
                    continue
                assert served.got == request.sent or served.dropped
                assert served.got_end or served.dropped
                assert request.got == served.sent
        self.check_prefixes()


SIDE = st.sampled_from("ab")
INDEX = st.integers(0, 7)
COMMANDS = st.lists(
    st.one_of(
        st.tuples(st.just("open"), SIDE, st.integers(0, 30)),
        st.tuples(st.just("write"), SIDE, INDEX, st.integers(0, 40)),
        st.tuples(st.just("write"), SIDE, INDEX, st.integers(1, 20)),
        st.tuples(st.just("deliver"), SIDE, st.integers(0, 60)),
        st.tuples(st.just("deliver"), SIDE, st.just(0)),
        st.tuples(st.just("end"), SIDE, INDEX),
        st.tuples(st.just("cancel"), SIDE, INDEX),
        st.tuples(st.just("drop"), SIDE, INDEX),
        st.tuples(st.just("ping"), SIDE),
    ),
    min_size=10,
    max_size=100,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split=st.sampled_from([1, 2, 5, 1 << 30]), commands=COMMANDS)
def test_random_interleavings_conserve_bytes(split: int, commands: list[tuple[object, ...]]) -> None:
    world = World(split)
    for command in commands:
        kind, side_name, *args = command
        side = world.a if side_name == "a" else world.b
        getattr(world, str(kind))(side, *args)
    world.drain()
    world.check()
    assert world.a.order.open == world.b.order.open == set()


def test_consumed_data_sends_nothing() -> None:
    # Streamux has no credit on the wire: consuming a request's bytes says nothing.
    a, b = pair()
    _ha, hb = served_request(a, b, b"body")
    b.ack_consumed(hb, 4)
    b.ack_consumed(999, 4)
    assert out(b) == b""
