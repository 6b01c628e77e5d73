"""Tests of the smux codec (:mod:`polymux.wire.smux`).

Expected bytes are derived by hand from xtaci/smux (``frame.go``, and ``sendLoop`` in
``session.go``, which writes ``buf[0] = ver, buf[1] = cmd``, then ``PutUint16(buf[2:],
len(data))`` and ``PutUint32(buf[4:], sid)``, both little-endian; README "Specification"),
not produced by the code under test:

* 8-byte header: version u8 (1 or 2), cmd u8 (SYN 0, FIN 1, PSH 2, NOP 3, UPD 4), length
  u16 LE, stream id u32 LE;
* PSH carries ``length`` payload bytes; UPD (version 2 only) an 8-byte body, consumed u32
  LE then window u32 LE (``updHeader``, ``sendWindowUpdate``); SYN, FIN, NOP none (v1.5.57
  rejects a length on them, and a UPD whose length is not 8).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from polymux.exceptions import ProtocolError
from polymux.wire.smux import (
    HEADER_SIZE,
    INITIAL_PEER_WINDOW,
    MAX_PAYLOAD,
    Cmd,
    Decoder,
    Frame,
    decode_upd,
    encode_frame,
    encode_header,
    encode_upd,
    frame_parts,
)


def h(text: str) -> bytes:
    """Hex (spaces allowed) to bytes."""
    return bytes.fromhex(text)


def norm(frames: list[Frame]) -> list[Frame]:
    """Frames with their (memoryview) bodies turned into bytes."""
    return [f._replace(body=bytes(f.body)) for f in frames]


def body(n: int) -> bytes:
    """A recognisable body of ``n`` bytes."""
    return (bytes(range(251)) * (n // 251 + 1))[:n]


# -- byte vectors ------------------------------------------------------------------------

# (version, frame, bytes)
SPELLED: list[tuple[int, Frame, str]] = [
    (1, Frame(Cmd.SYN, 3), "01 00 0000 03000000"),  # a client's first stream
    (1, Frame(Cmd.SYN, 2), "01 00 0000 02000000"),  # a server's first stream
    (1, Frame(Cmd.FIN, 3), "01 01 0000 03000000"),
    (1, Frame(Cmd.PSH, 3, b"hello"), "01 02 0500 03000000 68656c6c6f"),
    (1, Frame(Cmd.PSH, 0x01020304, b"ab"), "01 02 0200 04030201 6162"),
    (1, Frame(Cmd.PSH, 5), "01 02 0000 05000000"),  # an empty PSH (xtaci skips it)
    (1, Frame(Cmd.NOP, 0), "01 03 0000 00000000"),  # keepalive
    (2, Frame(Cmd.SYN, 0xFFFFFFFF), "02 00 0000 ffffffff"),
    (2, Frame(Cmd.PSH, 2, b"\x00"), "02 02 0100 02000000 00"),
    (2, Frame(Cmd.NOP, 0), "02 03 0000 00000000"),
    # UPD: consumed 1 (the first read), window 64 KiB (xtaci's MaxStreamBuffer)
    (2, Frame(Cmd.UPD, 3, h("01000000 00000100")), "02 04 0800 03000000 01000000 00000100"),
    # UPD: consumed wrapped past 2**32, window 256 KiB
    (2, Frame(Cmd.UPD, 2, h("ffffffff 00000400")), "02 04 0800 02000000 ffffffff 00000400"),
]


@pytest.mark.parametrize(("version", "frame", "expected"), SPELLED)
def test_spelled_out_vectors(version: int, frame: Frame, expected: str) -> None:
    raw = h(expected)
    assert encode_frame(version, frame) == raw
    header, payload = frame_parts(version, frame)
    assert header == raw[:HEADER_SIZE] == encode_header(version, frame.cmd, frame.stream_id, len(frame.body))
    assert payload is frame.body  # no copy
    dec = Decoder(version)
    assert norm(dec.feed(raw)) == [frame]
    assert dec.pending == 0


def test_upd_vectors() -> None:
    raw = encode_upd(2, 7, 2**32 + 5, 1024 * 1024)  # consumed counts modulo 2**32
    assert raw == h("02 04 0800 07000000 05000000 00001000")
    [frame] = Decoder(2).feed(raw)
    assert frame.cmd == Cmd.UPD and frame.stream_id == 7
    assert decode_upd(frame.body) == (5, 1024 * 1024)
    assert INITIAL_PEER_WINDOW == 256 * 1024


def test_largest_frame() -> None:
    payload = body(MAX_PAYLOAD)
    raw = encode_frame(1, Frame(Cmd.PSH, 9, payload))
    assert raw[:HEADER_SIZE] == h("01 02 ffff 09000000")
    assert norm(Decoder(1).feed(raw)) == [Frame(Cmd.PSH, 9, payload)]


def test_frames_back_to_back_and_bodies_are_views() -> None:
    raw = h("01 00 0000 03000000") + h("01 02 0300 03000000 616263") + h("01 03 0000 00000000")
    raw += h("01 01 0000 03000000")
    frames = Decoder(1).feed(raw)
    assert norm(frames) == [Frame(0, 3), Frame(2, 3, b"abc"), Frame(3, 0), Frame(1, 3)]
    assert isinstance(frames[1].body, memoryview)


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_feed_accepts_any_bytes_like(kind: type) -> None:
    raw = h("02 02 0200 04000000 6869")
    assert norm(Decoder(2).feed(kind(raw))) == [Frame(Cmd.PSH, 4, b"hi")]


# -- incremental decoding ----------------------------------------------------------------


def test_every_split_point() -> None:
    frames = [
        Frame(Cmd.SYN, 3),
        Frame(Cmd.PSH, 3, body(300)),
        Frame(Cmd.UPD, 3, h("2c010000 00000100")),
        Frame(Cmd.NOP, 0),
        Frame(Cmd.PSH, 3, b""),
        Frame(Cmd.FIN, 3),
    ]
    raw = b"".join(encode_frame(2, f) for f in frames)
    for cut in range(len(raw) + 1):
        dec = Decoder(2)
        got = norm(dec.feed(raw[:cut]))
        got += norm(dec.feed(raw[cut:]))
        assert got == frames, cut
        assert dec.pending == 0


def test_byte_at_a_time_and_partial_stream() -> None:
    raw = encode_frame(1, Frame(Cmd.PSH, 0x0A0B0C0D, b"xyz"))
    dec = Decoder(1)
    for i, byte in enumerate(raw[:-1]):
        assert dec.feed(bytes([byte])) == []
        assert dec.pending == i + 1
        assert dec.partial_stream() == (0x0A0B0C0D if i + 1 >= HEADER_SIZE else None)
    assert norm(dec.feed(raw[-1:])) == [Frame(Cmd.PSH, 0x0A0B0C0D, b"xyz")]
    assert dec.pending == 0 and dec.partial_stream() is None


def test_partial_header_then_rest_with_more_frames() -> None:
    a = encode_frame(2, Frame(Cmd.FIN, 5))
    b = encode_frame(2, Frame(Cmd.PSH, 5, b"12345"))
    dec = Decoder(2)
    assert dec.feed(a[:3]) == []
    assert norm(dec.feed(a[3:] + b)) == [Frame(Cmd.FIN, 5), Frame(Cmd.PSH, 5, b"12345")]


def test_buffering_is_bounded_by_one_frame() -> None:
    """A peer that announces the largest body and trickles it is held to 8 + 65,535 bytes."""
    dec = Decoder(1)
    dec.feed(encode_header(1, Cmd.PSH, 3, MAX_PAYLOAD))
    for _ in range(MAX_PAYLOAD // 4096):
        assert dec.feed(bytes(4096)) == []
        assert dec.pending <= HEADER_SIZE + MAX_PAYLOAD
    rest = MAX_PAYLOAD - (MAX_PAYLOAD // 4096) * 4096
    [frame] = dec.feed(bytes(rest) + encode_header(1, Cmd.NOP, 0)[:5])
    assert len(frame.body) == MAX_PAYLOAD
    assert dec.pending == 5


SIZES = st.integers(0, 3000)


@st.composite
def frame_lists(draw: st.DrawFn, version: int) -> list[Frame]:
    cmds = [Cmd.SYN, Cmd.FIN, Cmd.PSH, Cmd.NOP] + ([Cmd.UPD] if version == 2 else [])
    out = []
    for _ in range(draw(st.integers(0, 12))):
        cmd = draw(st.sampled_from(cmds))
        sid = draw(st.integers(0, 2**32 - 1))
        if cmd == Cmd.PSH:
            payload = draw(st.binary(max_size=3000))
        elif cmd == Cmd.UPD:
            payload = draw(st.binary(min_size=8, max_size=8))
        else:
            payload = b""
        out.append(Frame(cmd, sid, payload))
    return out


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 2]).flatmap(lambda v: st.tuples(st.just(v), frame_lists(v))), st.data())
def test_round_trip_any_chunking(case: tuple[int, list[Frame]], data: st.DataObject) -> None:
    version, frames = case
    raw = b"".join(encode_frame(version, f) for f in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    dec = Decoder(version)
    got: list[Frame] = []
    last = 0
    for cut in [*cuts, len(raw)]:
        got += norm(dec.feed(raw[last:cut]))
        last = cut
    assert got == frames
    assert dec.pending == 0


@settings(max_examples=200)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**40), st.integers(0, 2**32 - 1))
def test_upd_round_trip(sid: int, consumed: int, window: int) -> None:
    [frame] = Decoder(2).feed(encode_upd(2, sid, consumed, window))
    assert frame.stream_id == sid
    assert decode_upd(frame.body) == (consumed % 2**32, window)


@settings(max_examples=300)
@given(st.binary(max_size=200), st.sampled_from([1, 2]))
def test_garbage_never_crashes(raw: bytes, version: int) -> None:
    """Any input decodes or raises ProtocolError, with at most one frame held back."""
    dec = Decoder(version)
    try:
        dec.feed(raw)
    except ProtocolError as exc:
        assert str(exc).startswith("smux")
    else:
        assert dec.pending < HEADER_SIZE + MAX_PAYLOAD


# -- malformed input ---------------------------------------------------------------------

BAD: list[tuple[int, str, str]] = [
    (1, "02 02 0100 03000000 00", r"version is 2, expected 1 .*same smux protocol version"),
    (2, "01 00 0000 03000000", r"version is 1, expected 2"),
    (1, "00 03 0000 00000000", r"version is 0, expected 1"),
    (1, "01 05 0000 03000000", r"unknown cmd 5 \(stream 3\)"),
    (2, "02 ff 0000 07000000", r"unknown cmd 255 \(stream 7\)"),
    (1, "01 04 0800 03000000 0000000000000000", r"UPD \(cmd 4\) on stream 3 in protocol version 1"),
    (2, "02 04 0400 03000000 00000000", r"UPD frame length is 4 on stream 3, must be 8"),
    (2, "02 04 0000 03000000", r"UPD frame length is 0 on stream 3, must be 8"),
    (1, "01 00 0100 03000000 00", r"SYN frame length is 1 on stream 3, must be 0"),
    (2, "02 01 0200 05000000 0000", r"FIN frame length is 2 on stream 5, must be 0"),
    (1, "01 03 ffff 00000000", r"NOP frame length is 65535 on stream 0, must be 0"),
]


@pytest.mark.parametrize(("version", "raw", "message"), BAD)
def test_malformed_whole(version: int, raw: str, message: str) -> None:
    fmt = "smux" if version == 1 else "smux-v2"
    with pytest.raises(ProtocolError, match=message) as info:
        Decoder(version, fmt).feed(h(raw))
    assert info.value.format == fmt
    assert str(info.value).startswith(fmt + ":")


@pytest.mark.parametrize(("version", "raw", "message"), BAD)
def test_malformed_after_a_good_frame_and_split(version: int, raw: str, message: str) -> None:
    """The error comes as soon as the bad header is complete, whether it follows a good
    frame in the same read or arrives in pieces."""
    good = encode_frame(version, Frame(Cmd.PSH, 3, b"ok"))
    with pytest.raises(ProtocolError, match=message):
        Decoder(version).feed(good + h(raw)[:HEADER_SIZE])
    dec = Decoder(version)
    assert norm(dec.feed(good + h(raw)[:5])) == [Frame(Cmd.PSH, 3, b"ok")]
    with pytest.raises(ProtocolError, match=message):
        dec.feed(h(raw)[5:HEADER_SIZE])


def test_bad_version_argument() -> None:
    with pytest.raises(ValueError, match="version must be 1 or 2, got 3"):
        Decoder(3)


@pytest.mark.parametrize(
    ("version", "frame", "message"),
    [
        (1, Frame(7, 3), "no command 7"),
        (1, Frame(-1, 3), "no command -1"),
        (1, Frame(Cmd.PSH, 3, bytes(MAX_PAYLOAD + 1)), "65536 bytes exceeds 65535"),
        (1, Frame(Cmd.UPD, 3, bytes(8)), "version 2"),
        (2, Frame(Cmd.UPD, 3, bytes(7)), "8-byte body"),
        (2, Frame(Cmd.SYN, 3, b"x"), "SYN frame carries no body"),
        (1, Frame(Cmd.NOP, 0, b"xy"), "NOP frame carries no body"),
    ],
)
def test_encode_refuses_what_the_wire_cannot_carry(version: int, frame: Frame, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode_frame(version, frame)


def test_encode_upd_needs_version_2() -> None:
    with pytest.raises(ValueError, match="only in protocol version 2"):
        encode_upd(1, 3, 0, 0)
