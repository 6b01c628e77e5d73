"""Tests of the sans-I/O MultiplexingStream engine (``polymux.engine.mstream``).

Engines are driven with bytes in and bytes out: no sockets, no asyncio. Input frames
are built with the codec in ``polymux.wire.mstream``; expected output bytes are spelled
out in hex where the exact encoding matters (PROTOCOL-NOTES A1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from polymux.config import SessionConfig
from polymux.engine import flow
from polymux.engine.events import (
    ChannelAccepted,
    ChannelClosed,
    ChannelEnded,
    ChannelOpened,
    ChannelRejected,
    ChannelReset,
    CreditAvailable,
    DataReceived,
    Event,
    ReadingStopped,
    SessionReady,
)
from polymux.engine.mstream import DEFAULT_REMOTE_WINDOW, MStreamEngine
from polymux.exceptions import FlowControlError, ProtocolError
from polymux.wire import mstream as wire
from polymux.wire.mstream import ChannelSource, ControlCode as C, Frame


# The odd party is the one whose random bytes compare greater (lexicographically).
RANDOM_ODD = bytes([0xF0]) + bytes(range(15))
RANDOM_EVEN = bytes([0x0F]) + bytes(range(15))

DEFAULT_WINDOW = SessionConfig().receive_window
assert DEFAULT_WINDOW == 0x100000  # the hex below spells it out

ALL_VERSIONS = [1, 2, 3]
FLOW_VERSIONS = [2, 3]
HANDSHAKE_VERSIONS = [1, 2]


# -- helpers -----------------------------------------------------------------------------


def pair(
    version: int,
    *,
    handshake: bool = True,
    a_config: dict[str, int] | None = None,
    b_config: dict[str, int] | None = None,
    **config: int,
) -> tuple[MStreamEngine, MStreamEngine]:
    """Two engines with fixed random bytes: ``a`` is the odd party, ``b`` the even one.

    ``config`` applies to both; ``a_config``/``b_config`` override per side. With
    ``handshake`` (the default) the v1/v2 handshakes are exchanged and both outputs
    are drained, so the engines start quiet and ready.
    """
    a = MStreamEngine(version, SessionConfig(**{**config, **(a_config or {})}), random=RANDOM_ODD)
    b = MStreamEngine(version, SessionConfig(**{**config, **(b_config or {})}), random=RANDOM_EVEN)
    if handshake:
        ev_b = pump(a, b)
        ev_a = pump(b, a)
        expected = [SessionReady()] if version != 3 else []
        assert ev_a == expected
        assert ev_b == expected
        assert a.ready and b.ready
        assert out(a) == b"" and out(b) == b""
    return a, b


def out(engine: MStreamEngine) -> bytes:
    """Everything ``engine`` wants to send, joined."""
    return b"".join(bytes(chunk) for chunk in engine.data_to_send())


def norm(events: list[Event]) -> list[Event]:
    """Copy DataReceived payloads to ``bytes`` (decoded ones are memoryviews)."""
    return [
        DataReceived(e.channel, bytes(e.data) + b"".join(e.more), e.flow_controlled_length)
        if isinstance(e, DataReceived)
        else e
        for e in events
    ]


def pump(a: MStreamEngine, b: MStreamEngine) -> list[Event]:
    """Move ``a``'s pending output into ``b``; return ``b``'s events (payloads as bytes)."""
    return norm(b.receive_data(out(a)))


def frame(version: int, code: int, cid: int | None, payload: bytes = b"", source: int | None = None) -> bytes:
    """Encode one frame; for v3 ``source`` defaults to LOCAL (the sender's own channel)."""
    if version == 3 and cid is not None and source is None:
        source = ChannelSource.LOCAL
    if version != 3:
        source = None
    return wire.encode_frame(version, Frame(code, cid, payload, source))


def open_channel(a: MStreamEngine, b: MStreamEngine, name: str = "x") -> tuple[int, int]:
    """``a`` offers, ``b`` accepts; return (a's handle, b's handle)."""
    ha = a.open_channel(name)
    events = pump(a, b)
    assert len(events) == 1 and isinstance(events[0], ChannelOpened)
    hb = events[0].channel
    assert events[0].name == name
    b.accept_channel(hb)
    assert pump(b, a) == [ChannelAccepted(ha)]
    return ha, hb


def src(version: int, local: bool) -> int | None:
    """The v3 source a sender writes for a channel it (``local``) or its peer opened."""
    if version != 3:
        return None
    return ChannelSource.LOCAL if local else ChannelSource.REMOTE


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def decoded_frames(version: int, data: bytes) -> list[Frame]:
    frames = wire.Decoder(version, handshake=False).feed(data)
    assert all(isinstance(f, Frame) for f in frames)
    return frames  # type: ignore[return-value]


def assert_protocol_error(
    engine: MStreamEngine, data: bytes, *needles: str, exc: type[ProtocolError] = ProtocolError
) -> ProtocolError:
    """Feed ``data``; expect ``exc`` naming the format and every needle; engine closed after."""
    with pytest.raises(exc) as info:
        engine.receive_data(data)
    err = info.value
    assert err.format == f"mstream-v{engine.version}"
    text = str(err)
    assert text.startswith(f"mstream-v{engine.version}: ")
    for needle in needles:
        assert re.search(needle, text), (needle, text)
    assert engine.closed
    return err


# -- exact bytes out ---------------------------------------------------------------------


OFFER_X_PAYLOAD_V23 = "92 a1 78 ce 00 10 00 00"  # msgpack ["x", 1048576]


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (1, "2f df 1d 50" + RANDOM_ODD.hex()),
        (2, "92 92 02 00 c4 10" + RANDOM_ODD.hex()),
        (3, ""),
    ],
)
def test_handshake_bytes(version: int, expected: str) -> None:
    engine = MStreamEngine(version, random=RANDOM_ODD)
    data = out(engine)
    assert data == h(expected)
    if version != 3:
        assert data == wire.encode_handshake(version, RANDOM_ODD)
        assert not engine.ready
        assert engine.is_odd is None
    else:
        assert engine.ready
        assert engine.is_odd is None


def test_handshake_bytes_are_emitted_once() -> None:
    engine = MStreamEngine(2, random=RANDOM_ODD)
    assert out(engine)
    assert out(engine) == b""


def test_random_handshake_default_is_16_random_bytes() -> None:
    one = out(MStreamEngine(1))
    two = out(MStreamEngine(1))
    assert len(one) == len(two) == 20
    assert one[:4] == two[:4] == wire.V1_MAGIC
    assert one[4:] != two[4:]


def test_unknown_version_is_rejected() -> None:
    with pytest.raises(ValueError, match="version"):
        MStreamEngine(4)


def test_open_before_handshake_is_a_local_error() -> None:
    a, _b = pair(2, handshake=False)
    with pytest.raises(RuntimeError, match="mstream-v2"):
        a.open_channel("x")


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (1, "00 00000001 0001 78"),
        (2, "93 00 01 c4 08" + OFFER_X_PAYLOAD_V23),
        (3, "94 00 01 01 c4 08" + OFFER_X_PAYLOAD_V23),
    ],
)
def test_offer_bytes(version: int, expected: str) -> None:
    a, _b = pair(version)
    a.open_channel("x")
    data = out(a)
    assert data == h(expected)
    window = DEFAULT_WINDOW if version >= 2 else None
    assert data == frame(version, C.OFFER, 1, wire.encode_offer(version, "x", window))


def test_offer_advertises_configured_receive_window() -> None:
    a, _b = pair(2, receive_window=64)
    a.open_channel("x")
    assert out(a) == h("93 00 01 c4 04 92 a1 78 40")


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (1, "01 00000001 0000"),
        (2, "93 01 01 c4 06 91 ce 00 10 00 00"),
        (3, "94 01 01 ff c4 06 91 ce 00 10 00 00"),
    ],
)
def test_offer_accepted_bytes(version: int, expected: str) -> None:
    a, b = pair(version)
    a.open_channel("x")
    [opened] = pump(a, b)
    assert isinstance(opened, ChannelOpened)
    b.accept_channel(opened.channel)
    data = out(b)
    assert data == h(expected)
    window = DEFAULT_WINDOW if version >= 2 else None
    assert data == frame(
        version, C.OFFER_ACCEPTED, 1, wire.encode_offer_accepted(version, window), src(version, False)
    )


@pytest.mark.parametrize(
    ("version", "from_a", "from_b"),
    [
        (1, "02 00000001 0002 6869", "02 00000001 0002 6869"),
        (2, "93 02 01 c4 02 6869", "93 02 01 c4 02 6869"),
        (3, "94 02 01 01 c4 02 6869", "94 02 01 ff c4 02 6869"),
    ],
)
def test_content_bytes(version: int, from_a: str, from_b: str) -> None:
    a, b = pair(version)
    ha, hb = open_channel(a, b)
    a.send_data(ha, b"hi")
    assert out(a) == h(from_a)
    b.send_data(hb, b"hi")
    assert out(b) == h(from_b)


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_empty_content_sends_nothing(version: int) -> None:
    a, b = pair(version)
    ha, _hb = open_channel(a, b)
    a.send_data(ha, b"")
    assert out(a) == b""


@pytest.mark.parametrize(
    ("version", "expected"),
    [(1, "03 00000001 0000"), (2, "92 03 01"), (3, "93 03 01 01")],
)
def test_content_writing_completed_bytes(version: int, expected: str) -> None:
    a, b = pair(version)
    ha, _hb = open_channel(a, b)
    assert a.end_channel(ha) is False
    assert out(a) == h(expected)
    assert a.end_channel(ha) is False  # idempotent: nothing more is sent
    assert out(a) == b""


@pytest.mark.parametrize(
    ("version", "plain", "with_message"),
    [
        (1, "04 00000001 0000", "04 00000001 0000"),  # v1 never carries the message
        (2, "92 04 01", "93 04 01 c4 06 91 a4 626f6f6d"),
        (3, "93 04 01 01", "94 04 01 01 c4 06 91 a4 626f6f6d"),
    ],
)
def test_channel_terminated_bytes(version: int, plain: str, with_message: str) -> None:
    a, b = pair(version)
    ha, _hb = open_channel(a, b, "one")
    a.reset_channel(ha)
    assert out(a) == h(plain)
    hc, _hd = open_channel(a, b, "two")
    a.reset_channel(hc, "boom")
    # the second channel has id 3 (odd party; v3 counts 1, 2): patch the expected id
    cid = 2 if version == 3 else 3
    data = out(a)
    if version == 1:
        assert data == h(with_message.replace("00000001", "00000003"))
    else:
        assert data == h(with_message.replace(" 04 01", f" 04 0{cid}", 1))
    assert data == frame(version, C.CHANNEL_TERMINATED, cid, wire.encode_termination(version, "boom"))


@pytest.mark.parametrize(
    ("version", "expected"),
    [(2, "93 05 01 c4 02 91 0a"), (3, "94 05 01 ff c4 02 91 0a")],
)
def test_content_processed_bytes(version: int, expected: str) -> None:
    # window 64, ack_min 8: threshold max(8, 64 // 8) = 8
    a, b = pair(version, receive_window=64, ack_min=8)
    ha, hb = open_channel(a, b)
    a.send_data(ha, b"0123456789")
    pump(a, b)
    b.ack_consumed(hb, 10)
    assert out(b) == h(expected)


# -- odd/even election and id allocation -------------------------------------------------


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
def test_odd_party_allocates_odd_ids_even_party_even_ids(version: int) -> None:
    a, b = pair(version)
    assert a.is_odd is True
    assert b.is_odd is False
    for _ in range(3):
        a.open_channel("a")
        b.open_channel("b")
    assert [f.channel_id for f in decoded_frames(version, out(a))] == [1, 3, 5]
    assert [f.channel_id for f in decoded_frames(version, out(b))] == [2, 4, 6]


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
def test_election_compares_random_bytes_lexicographically(version: int) -> None:
    low = bytes(15) + b"\xff"  # differs only in the last byte
    high = b"\x01" + bytes(15)
    a = MStreamEngine(version, random=low)
    b = MStreamEngine(version, random=high)
    assert pump(a, b) == [SessionReady()]
    assert pump(b, a) == [SessionReady()]
    assert a.is_odd is False
    assert b.is_odd is True
    a.open_channel()
    b.open_channel()
    assert [f.channel_id for f in decoded_frames(version, out(a))] == [2]
    assert [f.channel_id for f in decoded_frames(version, out(b))] == [1]


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
def test_handshake_and_offer_in_one_chunk(version: int) -> None:
    a, b = pair(version, handshake=False)
    data = out(b)
    [ready] = a.receive_data(data)
    assert ready == SessionReady()
    ha = a.open_channel("early")
    # b gets a's handshake and offer in one write, split at an awkward place
    both = out(a)
    events = b.receive_data(both[:5]) + b.receive_data(both[5:])
    assert events[0] == SessionReady()
    assert isinstance(events[1], ChannelOpened) and events[1].name == "early"
    assert a.is_live(ha)


def test_v3_both_sides_count_from_one_with_sources() -> None:
    a, b = pair(3)
    assert a.is_odd is None and b.is_odd is None
    for _ in range(3):
        a.open_channel("a")
    frames = decoded_frames(3, out(a))
    assert [(f.channel_id, f.source) for f in frames] == [(1, 1), (2, 1), (3, 1)]


def test_v3_replies_for_peer_channels_carry_source_remote() -> None:
    a, b = pair(3)
    a.open_channel("x")
    [opened] = pump(a, b)
    assert isinstance(opened, ChannelOpened)
    hb = opened.channel
    b.accept_channel(hb)
    b.send_data(hb, b"z")
    b.end_channel(hb)
    frames = decoded_frames(3, out(b))
    assert [(f.code, f.channel_id, f.source) for f in frames] == [
        (C.OFFER_ACCEPTED, 1, -1),
        (C.CONTENT, 1, -1),
        (C.CONTENT_WRITING_COMPLETED, 1, -1),
    ]


def test_v3_simultaneous_open_of_id_one_gives_two_channels() -> None:
    a, b = pair(3)
    ha = a.open_channel("from-a")
    hb = b.open_channel("from-b")
    [opened_at_b] = pump(a, b)
    [opened_at_a] = pump(b, a)
    assert isinstance(opened_at_a, ChannelOpened) and opened_at_a.name == "from-b"
    assert isinstance(opened_at_b, ChannelOpened) and opened_at_b.name == "from-a"
    ha2, hb2 = opened_at_a.channel, opened_at_b.channel
    assert len({ha, ha2}) == 2 and len({hb, hb2}) == 2
    assert a.channel_count == 2 and b.channel_count == 2
    assert a.channel_name(ha) == "from-a" and a.channel_name(ha2) == "from-b"

    b.accept_channel(hb2)
    a.accept_channel(ha2)
    assert pump(b, a) == [ChannelAccepted(ha)]
    assert pump(a, b) == [ChannelAccepted(hb)]

    a.send_data(ha, b"on a's channel")
    a.send_data(ha2, b"on b's channel")
    assert pump(a, b) == [DataReceived(hb2, b"on a's channel", 14), DataReceived(hb, b"on b's channel", 14)]
    b.send_data(hb, b"B1")
    b.send_data(hb2, b"A1")
    assert pump(b, a) == [DataReceived(ha2, b"B1", 2), DataReceived(ha, b"A1", 2)]

    # Closing one leaves the other intact.
    a.reset_channel(ha, "bye")
    events = pump(a, b)
    assert events == [ChannelReset(hb2, "bye")]
    assert b.is_live(hb) and not b.is_live(hb2)
    assert pump(b, a) == []  # b's answering termination is ignored
    assert a.is_live(ha2) and not a.is_live(ha)


# -- full lifecycle ----------------------------------------------------------------------


@pytest.mark.parametrize("version", ALL_VERSIONS)
@pytest.mark.parametrize("opener", ["odd", "even"])
@pytest.mark.parametrize("first_to_end", ["offerer", "acceptor"])
def test_full_lifecycle(version: int, opener: str, first_to_end: str) -> None:
    odd, even = pair(version)
    off, acc = (odd, even) if opener == "odd" else (even, odd)
    h_off = off.open_channel("life")
    assert off.channel_count == 1
    assert off.send_credit(h_off) == 0  # not accepted yet
    [opened] = pump(off, acc)
    assert isinstance(opened, ChannelOpened) and opened.name == "life"
    h_acc = opened.channel
    assert acc.channel_name(h_acc) == "life"
    acc.accept_channel(h_acc)
    assert pump(acc, off) == [ChannelAccepted(h_off)]

    off.send_data(h_off, b"ping")
    assert pump(off, acc) == [DataReceived(h_acc, b"ping", 4)]
    acc.send_data(h_acc, b"pong")
    assert pump(acc, off) == [DataReceived(h_off, b"pong", 4)]

    first, h_first, second, h_second = (
        (off, h_off, acc, h_acc) if first_to_end == "offerer" else (acc, h_acc, off, h_off)
    )
    assert first.end_channel(h_first) is False
    assert first.is_live(h_first)
    assert pump(first, second) == [ChannelEnded(h_second)]
    # The other direction still works after a half-close.
    second.send_data(h_second, b"more")
    assert pump(second, first) == [DataReceived(h_first, b"more", 4)]
    with pytest.raises(RuntimeError):
        first.send_data(h_first, b"late")
    assert first.send_credit(h_first) == 0

    assert second.end_channel(h_second) is True  # both ended: forgotten at once
    assert not second.is_live(h_second)
    assert second.channel_count == 0
    data = out(second)
    frames = decoded_frames(version, data)
    assert [f.code for f in frames] == [C.CONTENT_WRITING_COMPLETED, C.CHANNEL_TERMINATED]
    assert frames[1].payload == b""
    events = norm(first.receive_data(data))
    assert events == [ChannelEnded(h_first), ChannelClosed(h_first, local_done=True)]
    assert not first.is_live(h_first)
    assert first.channel_count == 0
    # first answered with its own termination; second ignores it
    reply = out(first)
    assert [f.code for f in decoded_frames(version, reply)] == [C.CHANNEL_TERMINATED]
    assert second.receive_data(reply) == []
    assert out(second) == b""
    assert not first.closed and not second.closed


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_simultaneous_half_close(version: int) -> None:
    a, b = pair(version)
    ha, hb = open_channel(a, b)
    assert a.end_channel(ha) is False
    assert b.end_channel(hb) is False
    assert pump(a, b) == [ChannelEnded(hb), ChannelClosed(hb)]
    assert pump(b, a) == [ChannelEnded(ha), ChannelClosed(ha)]
    assert pump(a, b) == []
    assert pump(b, a) == []
    assert a.channel_count == b.channel_count == 0
    assert not a.closed and not b.closed


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_clean_termination_before_we_ended_is_closed_not_done(version: int) -> None:
    a, b = pair(version)
    ha, hb = open_channel(a, b)
    a.end_channel(ha)
    a.reset_channel(ha)  # no message after our end: a clean close on the wire
    assert pump(a, b) == [ChannelEnded(hb), ChannelClosed(hb, local_done=False)]
    assert not b.is_live(hb)
    assert [f.code for f in decoded_frames(version, out(b))] == [C.CHANNEL_TERMINATED]


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_reject(version: int) -> None:
    a, b = pair(version)
    ha = a.open_channel("no")
    [opened] = pump(a, b)
    assert isinstance(opened, ChannelOpened)
    hb = opened.channel
    b.reject_channel(hb)
    assert not b.is_live(hb)
    assert b.channel_count == 0
    data = out(b)
    assert [f.code for f in decoded_frames(version, data)] == [C.CHANNEL_TERMINATED]
    assert a.receive_data(data) == [ChannelRejected(ha)]
    assert not a.is_live(ha)
    assert a.channel_count == 0
    assert pump(a, b) == []  # whatever a says now is harmless
    assert not a.closed and not b.closed


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_accept_or_reject_twice_is_a_local_error(version: int) -> None:
    a, b = pair(version)
    ha, hb = open_channel(a, b)
    with pytest.raises(RuntimeError):
        b.accept_channel(hb)
    with pytest.raises(RuntimeError):
        b.reject_channel(hb)
    with pytest.raises(RuntimeError):
        a.accept_channel(ha)  # our own offer
    with pytest.raises(KeyError):
        a.accept_channel(999)


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_reset_with_message(version: int) -> None:
    a, b = pair(version)
    ha, hb = open_channel(a, b)
    a.reset_channel(ha, "boom")
    assert not a.is_live(ha)
    assert a.channel_count == 0
    expected_message = "boom" if version >= 2 else None
    assert pump(a, b) == [ChannelReset(hb, expected_message)]
    assert not b.is_live(hb)
    assert b.channel_count == 0
    # b answers with its own ChannelTerminated (no message), as the references do
    reply = out(b)
    assert reply == frame(version, C.CHANNEL_TERMINATED, 1, b"", src(version, False))
    assert a.receive_data(reply) == []  # ...which a ignores silently
    assert out(a) == b""
    assert not a.closed and not b.closed
    a.reset_channel(ha, "again")  # resetting a forgotten channel is a no-op
    assert out(a) == b""


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_reset_without_message_before_end_is_a_reset(version: int) -> None:
    a, b = pair(version)
    ha, hb = open_channel(a, b)
    a.reset_channel(ha)
    assert pump(a, b) == [ChannelReset(hb, None)]


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_peer_rescinds_its_offer(version: int) -> None:
    a, b = pair(version)
    ha = a.open_channel("gone")
    a.reset_channel(ha)
    events = pump(a, b)
    assert len(events) == 2
    assert isinstance(events[0], ChannelOpened)
    assert events[1] == ChannelReset(events[0].channel, None)
    assert b.channel_count == 0
    assert pump(b, a) == []


# -- flow control ------------------------------------------------------------------------


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_send_credit_starts_at_peer_window_and_drops(version: int) -> None:
    a, b = pair(version, ack_min=10, a_config={"receive_window": 1000}, b_config={"receive_window": 300})
    ha = a.open_channel("x")
    assert a.send_credit(ha) == 0
    [opened] = pump(a, b)
    assert isinstance(opened, ChannelOpened)
    hb = opened.channel
    assert b.send_credit(hb) == 0  # not accepted by b yet
    b.accept_channel(hb)
    assert b.send_credit(hb) == 1000  # a's window, from the Offer
    pump(b, a)
    assert a.send_credit(ha) == 300  # b's window, from OfferAccepted

    a.send_data(ha, bytes(100))
    assert a.send_credit(ha) == 200
    b.send_data(hb, bytes(999))
    assert b.send_credit(hb) == 1


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_receiver_that_never_acks_blocks_the_sender(version: int) -> None:
    a, b = pair(version, receive_window=300, ack_min=10)
    ha, _hb = open_channel(a, b)
    sent = 0
    while a.send_credit(ha):
        n = min(70, a.send_credit(ha))
        a.send_data(ha, bytes(n))
        sent += n
        pump(a, b)
    assert sent == 300
    assert a.send_credit(ha) == 0
    with pytest.raises(ValueError, match="exceeds the available credit"):
        a.send_data(ha, b"!")
    assert out(a) == b""
    assert not b.closed


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_ack_is_batched_at_threshold(version: int) -> None:
    # window 300, ack_min 10: threshold = max(10, 300 // 8) = 37
    a, b = pair(version, receive_window=300, ack_min=10)
    ha, hb = open_channel(a, b)
    a.send_data(ha, bytes(300))
    pump(a, b)
    assert a.send_credit(ha) == 0

    b.ack_consumed(hb, 20)
    b.ack_consumed(hb, 16)
    assert out(b) == b""  # 36 < 37
    b.ack_consumed(hb, 1)
    data = out(b)
    assert data == frame(
        version, C.CONTENT_PROCESSED, 1, wire.encode_content_processed(37), src(version, False)
    )
    assert a.receive_data(data) == [CreditAvailable(ha)]
    assert a.send_credit(ha) == 37

    # Over the threshold in one go: one frame with the whole delta; a was not blocked,
    # so no CreditAvailable event.
    b.ack_consumed(hb, 50)
    data = out(b)
    assert decoded_frames(version, data) == [
        Frame(C.CONTENT_PROCESSED, 1, wire.encode_content_processed(50), src(version, False))
    ]
    assert a.receive_data(data) == []
    assert a.send_credit(ha) == 87

    # Acking more than was received is capped at what is outstanding.
    b.ack_consumed(hb, 10_000)
    data = out(b)
    assert decoded_frames(version, data) == [
        Frame(C.CONTENT_PROCESSED, 1, wire.encode_content_processed(213), src(version, False))
    ]
    a.receive_data(data)
    assert a.send_credit(ha) == 300

    b.ack_consumed(hb, 0)
    b.ack_consumed(hb, -5)
    assert out(b) == b""


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_credit_available_when_credit_returns_to_blocked_sender(version: int) -> None:
    a, b = pair(version, receive_window=64, ack_min=8)
    ha, hb = open_channel(a, b)
    a.send_data(ha, bytes(64))
    pump(a, b)
    assert a.send_credit(ha) == 0
    b.ack_consumed(hb, 8)
    assert pump(b, a) == [CreditAvailable(ha)]
    assert a.send_credit(ha) == 8


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_ack_after_peer_ended_sends_nothing(version: int) -> None:
    a, b = pair(version, receive_window=64, ack_min=8)
    ha, hb = open_channel(a, b)
    a.send_data(ha, bytes(64))
    a.end_channel(ha)
    pump(a, b)
    b.ack_consumed(hb, 64)
    assert out(b) == b""


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_offer_without_window_gets_default_remote_window(version: int) -> None:
    _a, b = pair(version)
    offer = frame(version, C.OFFER, 1, wire.encode_offer(version, "nowin", None))
    [opened] = b.receive_data(offer)
    assert isinstance(opened, ChannelOpened)
    hb = opened.channel
    b.accept_channel(hb)
    assert b.send_credit(hb) == DEFAULT_REMOTE_WINDOW == 5 * 20480


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_offer_accepted_without_window_gets_default_remote_window(version: int) -> None:
    a, _b = pair(version)
    ha = a.open_channel("x")
    accepted = frame(version, C.OFFER_ACCEPTED, 1, b"", src(version, False))
    assert a.receive_data(accepted) == [ChannelAccepted(ha)]
    assert a.send_credit(ha) == DEFAULT_REMOTE_WINDOW


def test_v1_has_no_flow_control() -> None:
    a, b = pair(1, receive_window=16, ack_min=1)
    assert not a.has_flow_control
    ha, hb = open_channel(a, b)
    assert a.send_credit(ha) == flow.UNLIMITED
    assert b.send_credit(hb) == flow.UNLIMITED
    for _ in range(10):
        a.send_data(ha, bytes(1000))  # far past receive_window: v1 does not care
    events = pump(a, b)
    # Consecutive frames of one channel arrive as one event.
    assert events == [DataReceived(hb, bytes(10_000), 10_000)] and not b.closed
    b.ack_consumed(hb, 10_000)
    assert out(b) == b""
    assert a.send_credit(ha) == flow.UNLIMITED


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_send_data_larger_than_a_frame_is_split_into_frames(version: int) -> None:
    a, b = pair(version, receive_window=1 << 20)
    ha, hb = open_channel(a, b)
    data = bytes(range(256)) * 200  # 51,200 bytes: two full frames and a 10,240-byte one
    a.send_data(ha, data)
    out = [bytes(c) for c in a.data_to_send()]
    frames = wire.Decoder(version, handshake=False).feed(b"".join(out))
    assert [len(f.payload) for f in frames] == [wire.MAX_PAYLOAD, wire.MAX_PAYLOAD, 10_240]
    assert all(f.code == wire.ControlCode.CONTENT for f in frames)
    events = norm(b.receive_data(b"".join(out)))
    assert b"".join(bytes(e.data) for e in events if isinstance(e, DataReceived)) == data
    assert {e.channel for e in events if isinstance(e, DataReceived)} == {hb}


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_send_data_beyond_the_credit_is_a_local_error(version: int) -> None:
    a, b = pair(version, receive_window=64 * 1024)
    ha, _hb = open_channel(a, b)
    with pytest.raises(ValueError, match="available credit"):
        a.send_data(ha, bytes(64 * 1024 + 1))


# -- window growth, unknown codes, reading completed -------------------------------------


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_window_growth_request_is_refused_with_current_window(version: int) -> None:
    a, b = pair(version, receive_window=300, ack_min=10)
    ha, hb = open_channel(a, b)
    # a's peer (b) asks a to grow a's receive window for channel 1 (b's view: remote).
    request = frame(version, C.CHANNEL_WINDOW_GROWTH_REQUEST, 1, b"", src(version, False))
    assert a.receive_data(request) == []
    expected = frame(version, C.CHANNEL_WINDOW_ADJUST, 1, wire.encode_window_adjust(300), src(version, True))
    assert out(a) == expected
    # b treats the same value as a refusal: no change, no event
    assert b.receive_data(expected) == []
    assert b.send_credit(hb) == 300
    # and the other direction
    request = frame(version, C.CHANNEL_WINDOW_GROWTH_REQUEST, 1, b"", src(version, True))
    assert b.receive_data(request) == []
    assert out(b) == frame(
        version, C.CHANNEL_WINDOW_ADJUST, 1, wire.encode_window_adjust(300), src(version, False)
    )
    assert a.send_credit(ha) == 300


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_window_growth_request_after_our_half_close_is_still_answered(version: int) -> None:
    a, b = pair(version, receive_window=300, ack_min=10)
    ha, _hb = open_channel(a, b)
    a.end_channel(ha)
    out(a)
    request = frame(version, C.CHANNEL_WINDOW_GROWTH_REQUEST, 1, b"", src(version, False))
    assert a.receive_data(request) == []
    assert out(a) == frame(
        version, C.CHANNEL_WINDOW_ADJUST, 1, wire.encode_window_adjust(300), src(version, True)
    )


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_window_growth_request_after_the_peers_end_is_not_answered(version: int) -> None:
    a, b = pair(version, receive_window=300, ack_min=10)
    ha, hb = open_channel(a, b)
    b.end_channel(hb)
    assert pump(b, a) == [ChannelEnded(ha)]
    request = frame(version, C.CHANNEL_WINDOW_GROWTH_REQUEST, 1, b"", src(version, False))
    assert a.receive_data(request) == []
    assert out(a) == b""  # nothing more comes from the peer: no window to grow


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_empty_content_is_no_event(version: int) -> None:
    a, b = pair(version)
    ha, hb = open_channel(a, b)
    assert b.receive_data(frame(version, C.CONTENT, 1, b"", src(version, True))) == []
    a.send_data(ha, b"after")
    assert pump(a, b) == [DataReceived(hb, b"after", 5)]


@pytest.mark.parametrize("version", FLOW_VERSIONS)  # (v1 ids are 32-bit)
def test_channel_id_beyond_2_53_is_a_protocol_error(version: int) -> None:
    a, _b = pair(version)
    too_big = 2**53
    with pytest.raises(
        ProtocolError,
        match=f"mstream-v{version}: frame with code 2 for channel id {too_big}, beyond {too_big - 1}",
    ):
        a.receive_data(frame(version, C.CONTENT, too_big, b"x", src(version, True)))


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_window_beyond_2_32_is_a_protocol_error(version: int) -> None:
    a, b = pair(version)
    open_channel(a, b)
    adjust = frame(version, C.CHANNEL_WINDOW_ADJUST, 1, wire.encode_window_adjust(2**32), src(version, False))
    with pytest.raises(
        ProtocolError,
        match=f"mstream-v{version}: WindowAdjust advertises a window of 4294967296 bytes, beyond 4294967295",
    ):
        a.receive_data(adjust)


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_sending_after_the_peer_stopped_reading_is_refused(version: int) -> None:
    a, b = pair(version)
    ha, _hb = open_channel(a, b)
    assert a.receive_data(frame(version, C.CONTENT_READING_COMPLETED, 1, b"", src(version, False))) == [
        ReadingStopped(ha)
    ]
    assert a.send_credit(ha) == 0
    with pytest.raises(
        RuntimeError, match=r"mstream-v\d: cannot send on channel 1 .*\(the peer stopped reading it\)"
    ):
        a.send_data(ha, b"x")


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_window_adjust_grows_credit_and_ignores_shrinking(version: int) -> None:
    a, b = pair(version, receive_window=300, ack_min=10)
    ha, _hb = open_channel(a, b)
    a.send_data(ha, bytes(300))
    out(a)
    assert a.send_credit(ha) == 0
    grow = frame(version, C.CHANNEL_WINDOW_ADJUST, 1, wire.encode_window_adjust(500), src(version, False))
    assert a.receive_data(grow) == [CreditAvailable(ha)]
    assert a.send_credit(ha) == 200
    shrink = frame(version, C.CHANNEL_WINDOW_ADJUST, 1, wire.encode_window_adjust(100), src(version, False))
    assert a.receive_data(shrink) == []
    assert a.send_credit(ha) == 200
    same = frame(version, C.CHANNEL_WINDOW_ADJUST, 1, wire.encode_window_adjust(500), src(version, False))
    assert a.receive_data(same) == []
    assert a.send_credit(ha) == 200
    assert out(a) == b""
    assert not a.closed


@pytest.mark.parametrize("version", ALL_VERSIONS)
@pytest.mark.parametrize("code", [9, 200])
def test_unknown_control_codes_are_ignored(version: int, code: int) -> None:
    a, b = pair(version)
    ha, _hb = open_channel(a, b)
    data = frame(version, code, 1, b"whatever", src(version, False))
    data += frame(version, code, 77, b"", src(version, True))  # even for ids never seen
    if version != 1:
        data += frame(version, code, None)
    assert a.receive_data(data) == []
    assert out(a) == b""
    assert not a.closed
    assert a.is_live(ha)


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_content_reading_completed(version: int) -> None:
    a, b = pair(version, receive_window=300, ack_min=10)
    ha, _hb = open_channel(a, b)
    assert a.send_credit(ha) > 0
    stop = frame(version, C.CONTENT_READING_COMPLETED, 1, b"", src(version, False))
    assert a.receive_data(stop) == [ReadingStopped(ha)]
    assert a.send_credit(ha) == 0
    assert a.receive_data(stop) == []  # only once
    assert a.is_live(ha)
    assert out(a) == b""


# -- benign races ------------------------------------------------------------------------


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_frames_for_a_terminated_channel_are_ignored(version: int) -> None:
    a, b = pair(version, receive_window=300, ack_min=10)
    ha, hb = open_channel(a, b)
    a.send_data(ha, bytes(100))
    pump(a, b)
    a.reset_channel(ha)
    reset_bytes = out(a)
    # Before b sees the reset, it sends more traffic for the channel.
    b.send_data(hb, b"late data")
    if version >= 2:
        b.ack_consumed(hb, 100)
    b.end_channel(hb)
    late = out(b)
    codes = [f.code for f in decoded_frames(version, late)]
    assert C.CONTENT in codes and C.CONTENT_WRITING_COMPLETED in codes
    assert (C.CONTENT_PROCESSED in codes) == (version >= 2)
    assert a.receive_data(late) == []
    for code in (
        C.CHANNEL_TERMINATED,
        C.CONTENT_READING_COMPLETED,
        C.CHANNEL_WINDOW_GROWTH_REQUEST,
    ):
        assert a.receive_data(frame(version, code, 1, b"", src(version, False))) == []
    assert out(a) == b""
    assert not a.closed
    # b gets the reset after all and answers; a ignores that too
    assert b.receive_data(reset_bytes) == [ChannelReset(hb, None)]
    assert pump(b, a) == []
    assert not a.closed and not b.closed


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_frames_for_peer_channel_after_we_terminated_are_ignored(version: int) -> None:
    a, b = pair(version)
    ha, hb = open_channel(a, b)
    b.reset_channel(hb, "no")
    a.send_data(ha, b"crossing")
    a.end_channel(ha)
    assert b.receive_data(out(a)) == []
    assert not b.closed


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_offer_accepted_after_we_rescinded_is_ignored(version: int) -> None:
    a, b = pair(version)
    ha = a.open_channel("x")
    [opened] = pump(a, b)
    assert isinstance(opened, ChannelOpened)
    hb = opened.channel
    b.accept_channel(hb)  # crosses a's rescission
    a.reset_channel(ha)
    rescind = out(a)
    assert pump(b, a) == []  # the OfferAccepted
    assert not a.closed
    assert b.receive_data(rescind) == [ChannelReset(hb, None)]
    assert pump(b, a) == []
    assert not a.closed and not b.closed
    assert a.channel_count == b.channel_count == 0


# -- protocol errors ---------------------------------------------------------------------


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_content_for_peer_channel_never_opened(version: int) -> None:
    _a, b = pair(version)
    # id 1 is the odd party's (a's) first id, never offered
    data = frame(version, C.CONTENT, 1, b"x", src(version, True))
    assert_protocol_error(b, data, r"Content frame for channel 1\b", "the peer's side never opened")


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_content_for_our_channel_never_opened(version: int) -> None:
    a, b = pair(version)
    open_channel(a, b)  # our id 1 exists; 3 (v1/v2) or 2 (v3) was never allocated
    cid = 2 if version == 3 else 3
    data = frame(version, C.CONTENT, cid, b"x", src(version, False))
    assert_protocol_error(a, data, rf"Content frame for channel {cid}\b", "our side never opened")


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
def test_error_offer_with_our_parity(version: int) -> None:
    a, b = pair(version)
    assert_protocol_error(a, frame(version, C.OFFER, 3, wire.encode_offer(version, "x", 10)), "channel 3")
    assert_protocol_error(b, frame(version, C.OFFER, 2, wire.encode_offer(version, "x", 10)), "channel 2")


def test_error_v3_offer_with_source_remote() -> None:
    a, _b = pair(3)
    data = frame(3, C.OFFER, 1, wire.encode_offer(3, "x", 10), ChannelSource.REMOTE)
    assert_protocol_error(a, data, "Offer for channel 1", "only we may allocate")


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_offer_reusing_an_id(version: int) -> None:
    _a, b = pair(version)
    step = 1 if version == 3 else 2
    offer1 = frame(version, C.OFFER, 1, wire.encode_offer(version, "one", 10))
    offer2 = frame(version, C.OFFER, 1 + step, wire.encode_offer(version, "two", 10))
    assert len(b.receive_data(offer1 + offer2)) == 2
    assert_protocol_error(b, offer1, "reuses channel id 1")


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_offer_reusing_an_id_after_it_closed(version: int) -> None:
    a, b = pair(version)
    ha, _hb = open_channel(a, b)
    a.reset_channel(ha)
    pump(a, b)
    pump(b, a)
    assert b.channel_count == 0
    assert_protocol_error(b, frame(version, C.OFFER, 1, wire.encode_offer(version, "x", 10)), "channel id 1")


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_content_after_writing_completed(version: int) -> None:
    a, b = pair(version)
    ha, _hb = open_channel(a, b)
    a.end_channel(ha)
    pump(a, b)
    assert_protocol_error(
        b, frame(version, C.CONTENT, 1, b"x"), "Content for channel 1", "after its ContentWritingCompleted"
    )


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_second_writing_completed(version: int) -> None:
    a, b = pair(version)
    ha, _hb = open_channel(a, b)
    a.end_channel(ha)
    pump(a, b)
    assert_protocol_error(
        b, frame(version, C.CONTENT_WRITING_COMPLETED, 1), "second ContentWritingCompleted for channel 1"
    )


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_content_before_offer_accepted(version: int) -> None:
    a, _b = pair(version)
    a.open_channel("pending")
    data = frame(version, C.CONTENT, 1, b"x", src(version, False))
    assert_protocol_error(a, data, r"Content for channel 1 \(local, 'pending'\)", "before it was accepted")


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_writing_completed_before_offer_accepted(version: int) -> None:
    a, _b = pair(version)
    a.open_channel("pending")
    data = frame(version, C.CONTENT_WRITING_COMPLETED, 1, b"", src(version, False))
    assert_protocol_error(a, data, "ContentWritingCompleted for channel 1", "before it was accepted")


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_offer_accepted_for_peer_offer(version: int) -> None:
    a, b = pair(version)
    b.open_channel("b's")
    pump(b, a)
    cid = 1 if version == 3 else 2
    data = frame(version, C.OFFER_ACCEPTED, cid, wire.encode_offer_accepted(version, 10))
    assert_protocol_error(a, data, f"OfferAccepted for channel {cid}", "not our pending offer")


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_offer_accepted_twice(version: int) -> None:
    a, b = pair(version)
    open_channel(a, b)
    data = frame(version, C.OFFER_ACCEPTED, 1, wire.encode_offer_accepted(version, 10), src(version, False))
    assert_protocol_error(a, data, "OfferAccepted for channel 1")


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_error_window_overrun(version: int) -> None:
    a, b = pair(version, receive_window=300, ack_min=10)
    _ha, hb = open_channel(a, b)
    # a peer ignoring the window: 300 bytes fit, the 301st does not
    ok = frame(version, C.CONTENT, 1, bytes(300))
    assert b.receive_data(ok) == [DataReceived(hb, bytes(300), 300)]
    err = assert_protocol_error(
        b,
        frame(version, C.CONTENT, 1, b"!"),
        "channel 1",
        "overran its receive window",
        "300",
        exc=FlowControlError,
    )
    assert isinstance(err, ProtocolError)


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_acked_bytes_make_room(version: int) -> None:
    a, b = pair(version, receive_window=300, ack_min=10)
    _ha, hb = open_channel(a, b)
    b.receive_data(frame(version, C.CONTENT, 1, bytes(300)))
    b.ack_consumed(hb, 100)
    assert out(b)
    assert b.receive_data(frame(version, C.CONTENT, 1, bytes(100))) == [DataReceived(hb, bytes(100), 100)]
    assert_protocol_error(b, frame(version, C.CONTENT, 1, b"!"), exc=FlowControlError)


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_error_content_processed_more_than_in_flight(version: int) -> None:
    a, b = pair(version)
    ha, _hb = open_channel(a, b)
    a.send_data(ha, bytes(10))
    data = frame(version, C.CONTENT_PROCESSED, 1, wire.encode_content_processed(11), src(version, False))
    assert_protocol_error(a, data, "ContentProcessed for channel 1", "acknowledges 11 bytes", "only 10")


def test_error_content_processed_in_v1() -> None:
    a, b = pair(1)
    ha, _hb = open_channel(a, b)
    a.send_data(ha, bytes(10))
    data = frame(1, C.CONTENT_PROCESSED, 1, wire.encode_content_processed(10))
    assert_protocol_error(a, data, "ContentProcessed for channel 1", "v1 has no flow control")


def test_error_handshake_with_other_major_version() -> None:
    engine = MStreamEngine(2, random=RANDOM_ODD)
    data = msgpack.packb([[3, 0], RANDOM_EVEN], use_bin_type=True)
    assert_protocol_error(engine, data, r"version is 3\.0", r"expected 2\.x")
    assert not engine.ready


def test_handshake_with_other_minor_version_is_fine() -> None:
    engine = MStreamEngine(2, random=RANDOM_ODD)
    assert engine.receive_data(msgpack.packb([[2, 7], RANDOM_EVEN], use_bin_type=True)) == [SessionReady()]
    assert engine.is_odd is True


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
def test_error_handshake_with_identical_random(version: int) -> None:
    a = MStreamEngine(version, random=RANDOM_ODD)
    b = MStreamEngine(version, random=RANDOM_ODD)
    assert_protocol_error(b, out(a), "random bytes equal ours")


def test_error_v1_bad_magic() -> None:
    engine = MStreamEngine(1, random=RANDOM_ODD)
    assert_protocol_error(engine, b"\x00" * 20, "magic")


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
@pytest.mark.parametrize("code", [C.CONTENT, C.OFFER, C.CHANNEL_TERMINATED])
def test_error_channel_id_zero(version: int, code: int) -> None:
    _a, b = pair(version)
    payload = wire.encode_offer(version, "x", 10) if code == C.OFFER else b""
    assert_protocol_error(b, frame(version, code, 0, payload), "channel id 0")


@pytest.mark.parametrize("code", [C.CONTENT, C.OFFER])
def test_error_v3_seeded_source(code: int) -> None:
    _a, b = pair(3)
    payload = wire.encode_offer(3, "x", 10) if code == C.OFFER else b"x"
    assert_protocol_error(b, frame(3, code, 1, payload, ChannelSource.SEEDED), "seeded channel 1")


@pytest.mark.parametrize("version", [2, 3])
def test_error_known_code_without_channel_id(version: int) -> None:
    _a, b = pair(version)
    assert_protocol_error(b, frame(version, C.CONTENT, None), "has no channel id")


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_data_after_closed(version: int) -> None:
    _a, b = pair(version)
    with pytest.raises(ProtocolError):
        b.receive_data(frame(version, C.CONTENT, 1, b"x"))
    assert b.closed
    assert_protocol_error(b, b"", "after the session ended")
    assert_protocol_error(b, frame(version, C.OFFER, 1, wire.encode_offer(version, "x", 10)), "ended")


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_data_after_eof(version: int) -> None:
    a, b = pair(version)
    _ha, hb = open_channel(a, b)
    a.close()  # a goodbye (none in this format): received data is still processed
    assert not a.closed
    a.receive_eof()
    assert a.closed
    b.end_channel(hb)
    assert_protocol_error(a, out(b), "after the session ended")


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_malformed_bytes_close_the_engine(version: int) -> None:
    _a, b = pair(version)
    garbage = b"\x00\x00\x00\x00\x01\xff\xff" if version == 1 else b"\xc1"
    assert_protocol_error(b, garbage)


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_error_bad_offer_payload_closes_the_engine(version: int) -> None:
    _a, b = pair(version)
    bad = b"\xff" if version == 1 else b"\xc1"  # invalid UTF-8 / invalid msgpack
    assert_protocol_error(b, frame(version, C.OFFER, 1, bad), "Offer")


@pytest.mark.parametrize("version", FLOW_VERSIONS)
def test_error_bad_content_processed_payload_closes_the_engine(version: int) -> None:
    a, b = pair(version)
    ha, _hb = open_channel(a, b)
    a.send_data(ha, bytes(10))
    data = frame(version, C.CONTENT_PROCESSED, 1, b"\x90", src(version, False))  # msgpack []
    assert_protocol_error(a, data, "ContentProcessed payload is an empty array")


# -- property: random interleavings conserve bytes ---------------------------------------


@dataclass
class Side:
    """The application on one end: what it wrote, what it read, what waits for credit."""

    name: str
    engine: MStreamEngine
    handles: dict[str, int] = field(default_factory=dict)  # channel name -> handle
    names: dict[int, str] = field(default_factory=dict)  # handle -> channel name
    usable: set[str] = field(default_factory=set)  # accepted, may send
    written: dict[str, bytearray] = field(default_factory=dict)  # everything the app wrote
    outbox: dict[str, bytearray] = field(default_factory=dict)  # written, not yet sent
    received: dict[str, bytearray] = field(default_factory=dict)
    unacked: dict[str, int] = field(default_factory=dict)
    want_end: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)  # closed, rejected or reset here
    opened: int = 0

    def known(self) -> list[str]:
        return sorted(self.handles)

    def learn(self, name: str, handle: int) -> None:
        self.handles[name] = handle
        self.names[handle] = name
        self.written.setdefault(name, bytearray())
        self.outbox.setdefault(name, bytearray())
        self.received.setdefault(name, bytearray())
        self.unacked.setdefault(name, 0)


class World:
    def __init__(self, version: int, a_window: int, b_window: int) -> None:
        ea, eb = pair(
            version,
            a_config={"receive_window": a_window, "ack_min": 1},
            b_config={"receive_window": b_window, "ack_min": 1},
        )
        self.a = Side("a", ea)
        self.b = Side("b", eb)
        self.reset_names: set[str] = set()
        self.counter = 0
        self.credit_events = 0

    def other(self, side: Side) -> Side:
        return self.b if side is self.a else self.a

    # commands

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

    def ack(self, side: Side, idx: int, n: int) -> None:
        names = [c for c in side.known() if side.unacked[c]]
        if not names:
            return
        name = names[idx % len(names)]
        n = min(n, side.unacked[name])
        side.unacked[name] -= n
        side.engine.ack_consumed(side.handles[name], n)

    def end(self, side: Side, idx: int) -> None:
        names = [c for c in side.known() if c not in side.want_end]
        if names:
            side.want_end.add(names[idx % len(names)])

    def reset(self, side: Side, idx: int, message: str | None) -> None:
        names = [c for c in side.known() if side.engine.is_live(side.handles[c])]
        if not names:
            return
        name = names[idx % len(names)]
        self.reset_names.add(name)
        side.engine.reset_channel(side.handles[name], message)
        side.gone.add(name)

    def deliver(self, side: Side) -> bool:
        """Send ``side``'s output to the other side; handle the events there."""
        data = out(side.engine)
        if not data:
            return False
        peer = self.other(side)
        for event in peer.engine.receive_data(data):
            if isinstance(event, ChannelOpened):
                peer.learn(event.name, event.channel)
                if peer.engine.is_live(event.channel):
                    peer.engine.accept_channel(event.channel)
                    peer.usable.add(event.name)
                continue
            name = peer.names[event.channel]  # type: ignore[attr-defined]
            if isinstance(event, ChannelAccepted):
                peer.usable.add(name)
            elif isinstance(event, DataReceived):
                data = bytes(event.data) + b"".join(event.more)
                assert event.flow_controlled_length == len(data) > 0
                peer.received[name] += data
                peer.unacked[name] += event.flow_controlled_length
            elif isinstance(event, ChannelEnded):
                assert name not in peer.gone
            elif isinstance(event, ChannelClosed):
                assert event.local_done or name in self.reset_names
                peer.gone.add(name)
            elif isinstance(event, ChannelReset):
                assert name in self.reset_names, (name, event)
                peer.gone.add(name)
            elif isinstance(event, CreditAvailable):
                # (a sender that ended meanwhile may get credit it can no longer use, and a
                # later event of the same batch may have closed the channel)
                live = peer.engine.is_live(event.channel)
                assert name in peer.ended or not live or peer.engine.send_credit(event.channel) > 0
                self.credit_events += 1
            else:
                pytest.fail(f"unexpected event {event!r}")
        return True

    def flush(self, side: Side) -> bool:
        """Send what credit allows; end channels whose outbox emptied."""
        engine = side.engine
        progress = False
        for name in side.known():
            handle = side.handles[name]
            if not engine.is_live(handle) or name not in side.usable:
                continue
            box = side.outbox[name]
            while box and name not in side.ended:
                credit = engine.send_credit(handle)
                if credit <= 0:
                    break
                n = min(len(box), credit, engine.max_frame)
                engine.send_data(handle, bytes(box[:n]))
                del box[:n]
                progress = True
            if name in side.want_end and not box and name not in side.ended:
                side.ended.add(name)
                if engine.end_channel(handle):
                    side.gone.add(name)
                progress = True
        return progress

    def settle(self) -> None:
        for side in (self.a, self.b):
            self.flush(side)

    def drain(self) -> None:
        """End everything and run until quiet."""
        for _ in range(100_000):
            progress = False
            for side in (self.a, self.b):
                side.want_end.update(side.known())
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


SIDE = st.sampled_from(["a", "b"])
_OPEN = st.tuples(st.just("open"), SIDE)
_WRITE = st.tuples(st.just("write"), SIDE, st.integers(0, 7), st.integers(1, 700))
_ACK = st.tuples(st.just("ack"), SIDE, st.integers(0, 7), st.integers(0, 700))
_END = st.tuples(st.just("end"), SIDE, st.integers(0, 7))
_RESET = st.tuples(st.just("reset"), SIDE, st.integers(0, 7), st.sampled_from([None, "", "boom"]))
_PUMP = st.tuples(st.just("pump"), SIDE)
# one_of picks branches uniformly: repeat the common commands to weight them
COMMANDS = st.lists(
    st.one_of(_OPEN, _WRITE, _WRITE, _WRITE, _ACK, _ACK, _END, _RESET, _PUMP, _PUMP, _PUMP),
    min_size=3,
    max_size=60,
).map(lambda cmds: [("open", "a"), ("open", "b"), ("write", "a", 0, 250), ("write", "b", 0, 250), *cmds])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from([1, 2, 3]),
    a_window=st.sampled_from([16, 100, 1000, 30_000]),
    b_window=st.sampled_from([16, 100, 1000, 30_000]),
    commands=COMMANDS,
)
def test_random_interleavings_conserve_bytes(
    version: int, a_window: int, b_window: int, commands: list[tuple[object, ...]]
) -> None:
    world = World(version, a_window, b_window)
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
        else:
            world.deliver(side)
        world.settle()
    world.drain()
    world.check()


@settings(max_examples=100, deadline=None)
@given(
    version=st.sampled_from([2, 3]),
    sizes=st.lists(st.integers(1, 400), min_size=1, max_size=30),
    ack_every=st.integers(1, 5),
    split=st.integers(1, 50),
)
def test_flow_control_never_overruns_and_chunking_is_transparent(
    version: int, sizes: list[int], ack_every: int, split: int
) -> None:
    """One channel, a greedy sender, a lazy reader, the wire cut into ``split``-byte pieces."""
    a, b = pair(version, receive_window=128, ack_min=1)
    ha, hb = open_channel(a, b)
    want = b"".join(bytes([i % 256]) * n for i, n in enumerate(sizes))
    pending = bytearray(want)
    got = bytearray()
    acked = 0
    rounds = 0
    while len(got) < len(want):
        rounds += 1
        assert rounds < 10_000
        while pending and a.send_credit(ha):
            n = min(len(pending), a.send_credit(ha))
            a.send_data(ha, bytes(pending[:n]))
            del pending[:n]
        data = out(a)
        for i in range(0, len(data), split):
            for event in b.receive_data(data[i : i + split]):
                assert isinstance(event, DataReceived)
                got += event.data
        if rounds % ack_every == 0 or not a.send_credit(ha):
            b.ack_consumed(hb, len(got) - acked)
            acked = len(got)
        for event in pump(b, a):
            assert event == CreditAvailable(ha)
    assert bytes(got) == want
