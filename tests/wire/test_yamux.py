"""Tests of the yamux codec (:mod:`polymux.wire.yamux`).

Expected bytes are derived by hand from hashicorp/yamux ``spec.md`` (PROTOCOL-NOTES A5), not
produced by the code under test:

* every frame starts with a 12-byte big-endian header: version u8 (always 0), type u8
  (0 Data, 1 WindowUpdate, 2 Ping, 3 GoAway), flags u16 (SYN 1, ACK 2, FIN 4, RST 8),
  stream id u32, length u32;
* only Data frames have a body (``length`` bytes); for the other types ``length`` is a
  value: a window delta, a ping's opaque value or a GoAway code.
"""

from __future__ import annotations

import random
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from polymux.exceptions import ProtocolError
from polymux.wire.yamux import (
    HEADER,
    INITIAL_WINDOW,
    Decoder,
    Flag,
    Frame,
    GoAwayCode,
    Type,
    encode_frame,
    encode_header,
)


U32 = 2**32 - 1
MAX = 1024 * 1024  # the decoders' data limit in most tests


def h(text: str) -> bytes:
    """Hex (spaces allowed) to bytes."""
    return bytes.fromhex(text)


def norm(frames: list[Frame]) -> list[Frame]:
    """Frames with their (memoryview) bodies turned into bytes, for plain comparison."""
    return [f._replace(body=bytes(f.body)) for f in frames]


def body(n: int) -> bytes:
    """A recognisable body of ``n`` bytes."""
    return (bytes(range(251)) * (n // 251 + 1))[:n]


# -- byte vectors ------------------------------------------------------------------------

# Whole frames spelled out byte by byte.
SPELLED: list[tuple[Frame, str]] = [
    # Data
    (Frame(0, 0, 1, 0), "00 00 0000 00000001 00000000"),
    (Frame(0, 0, 1, 5, b"hello"), "00 00 0000 00000001 00000005 68656c6c6f"),
    (Frame(0, 1, 3, 1, b"x"), "00 00 0001 00000003 00000001 78"),  # data with SYN
    (Frame(0, 4, 2, 2, b"hi"), "00 00 0004 00000002 00000002 6869"),  # data with FIN
    (Frame(0, 3, U32, 0), "00 00 0003 ffffffff 00000000"),  # SYN|ACK
    (Frame(0, 0, 0x01020304, 3, b"abc"), "00 00 0000 01020304 00000003 616263"),
    # WindowUpdate: length is the delta
    (Frame(1, 1, 1, 0), "00 01 0001 00000001 00000000"),  # open: SYN, delta 0
    (Frame(1, 2, 2, 0), "00 01 0002 00000002 00000000"),  # accept: ACK
    (Frame(1, 4, 5, 0), "00 01 0004 00000005 00000000"),  # half-close: FIN
    (Frame(1, 8, 7, 0), "00 01 0008 00000007 00000000"),  # reset: RST
    (Frame(1, 0, 1, 131072), "00 01 0000 00000001 00020000"),  # 128 KiB of credit
    (Frame(1, 1, 1, 786432), "00 01 0001 00000001 000c0000"),  # SYN announcing a bigger window
    (Frame(1, 12, 9, U32), "00 01 000c 00000009 ffffffff"),  # FIN|RST
    # Ping: length is the opaque value, echoed with ACK
    (Frame(2, 1, 0, 1), "00 02 0001 00000000 00000001"),
    (Frame(2, 2, 0, 0xDEADBEEF), "00 02 0002 00000000 deadbeef"),
    # GoAway: length is the code
    (Frame(3, 0, 0, 0), "00 03 0000 00000000 00000000"),
    (Frame(3, 0, 0, 1), "00 03 0000 00000000 00000001"),
    (Frame(3, 0, 0, 2), "00 03 0000 00000000 00000002"),
]


@pytest.mark.parametrize(("frame", "expected"), SPELLED)
def test_spelled_out_vectors(frame: Frame, expected: str) -> None:
    assert encode_frame(frame) == h(expected)
    assert encode_header(frame.type, frame.flags, frame.stream_id, frame.length) == h(expected)[:12]
    dec = Decoder(MAX)
    assert norm(dec.feed(h(expected))) == [frame]
    assert dec.pending == 0


TYPES = [Type.DATA, Type.WINDOW_UPDATE, Type.PING, Type.GO_AWAY]
FLAGS = [
    0,
    Flag.SYN,
    Flag.ACK,
    Flag.FIN,
    Flag.RST,
    Flag.SYN | Flag.ACK,
    Flag.SYN | Flag.FIN,
    Flag.ACK | Flag.FIN,
    Flag.FIN | Flag.RST,
    Flag.SYN | Flag.ACK | Flag.FIN | Flag.RST,
]
IDS = [0, 1, 2, U32]
ID_HEX = {0: "00000000", 1: "00000001", 2: "00000002", U32: "ffffffff"}
VALUES = [0, 1, U32]  # the length of non-data frames
VALUE_HEX = {0: "00000000", 1: "00000001", U32: "ffffffff"}
DATA_SIZES = [0, 1, 65536]
DATA_HEX = {0: "00000000", 1: "00000001", 65536: "00010000"}
BODIES = {n: body(n) for n in DATA_SIZES}
FLAG_HEX = {0: "0000", 1: "0001", 2: "0002", 4: "0004", 8: "0008", 3: "0003", 5: "0005", 6: "0006"}
FLAG_HEX |= {12: "000c", 15: "000f"}


def _vector(t: Type, flags: int, sid: int, k: int) -> tuple[Frame, str]:
    """The k-th size (Data) or value (other types) with this type, flags and id."""
    if t == Type.DATA:
        n = DATA_SIZES[k % 3]
        return Frame(t, flags, sid, n, BODIES[n]), f"00 00 {FLAG_HEX[flags]} {ID_HEX[sid]} {DATA_HEX[n]}"
    value = VALUES[k % 3]
    return Frame(t, flags, sid, value), f"00 {t:02x} {FLAG_HEX[flags]} {ID_HEX[sid]} {VALUE_HEX[value]}"


# Every type x flag combination x id; the size / value cycles so that every (type, id, size)
# and (type, flags, size) also occurs.
VECTORS: list[tuple[Frame, str]] = [
    _vector(t, flags, sid, fi + ii)
    for t in TYPES
    for fi, flags in enumerate(FLAGS)
    for ii, sid in enumerate(IDS)
]
VECTOR_IDS = [f"{Type(f.type).name}-f{f.flags}-id{f.stream_id}-len{f.length}" for f, _ in VECTORS]


def test_vector_table_coverage() -> None:
    assert {(f.type, f.flags, f.stream_id) for f, _ in VECTORS} == {
        (t, fl, sid) for t in TYPES for fl in FLAGS for sid in IDS
    }
    assert {(f.type, f.stream_id, f.length) for f, _ in VECTORS} >= {
        (t, sid, n) for t in TYPES for sid in IDS for n in (DATA_SIZES if t == Type.DATA else VALUES)
    }
    assert {(f.type, f.flags, f.length) for f, _ in VECTORS} >= {
        (t, fl, n) for t in TYPES for fl in FLAGS for n in (DATA_SIZES if t == Type.DATA else VALUES)
    }


@pytest.mark.parametrize(("frame", "header"), VECTORS, ids=VECTOR_IDS)
def test_encode_vectors(frame: Frame, header: str) -> None:
    assert encode_header(frame.type, frame.flags, frame.stream_id, frame.length) == h(header)
    assert encode_frame(frame) == h(header) + bytes(frame.body)


@pytest.mark.parametrize(("frame", "header"), VECTORS, ids=VECTOR_IDS)
def test_decode_vectors(frame: Frame, header: str) -> None:
    dec = Decoder(MAX)
    assert norm(dec.feed(h(header) + bytes(frame.body))) == [frame]
    assert dec.pending == 0


def test_constants() -> None:
    assert HEADER.size == 12
    assert HEADER.format == ">BBHII"
    assert INITIAL_WINDOW == 256 * 1024
    assert [int(t) for t in Type] == [0, 1, 2, 3]
    assert (Type.DATA, Type.WINDOW_UPDATE, Type.PING, Type.GO_AWAY) == (0, 1, 2, 3)
    assert (Flag.SYN, Flag.ACK, Flag.FIN, Flag.RST) == (1, 2, 4, 8)
    assert (GoAwayCode.NORMAL, GoAwayCode.PROTOCOL_ERROR, GoAwayCode.INTERNAL_ERROR) == (0, 1, 2)
    dec = Decoder(100)
    assert dec.max_data == 100
    assert dec.format == "yamux"
    assert dec.pending == 0
    assert Frame(1, 0, 1, 5).body == b""


def test_encode_frame_rejects_data_length_mismatch() -> None:
    with pytest.raises(ValueError, match="yamux"):
        encode_frame(Frame(Type.DATA, 0, 1, 3, b"ab"))
    with pytest.raises(ValueError, match="length 0"):
        encode_frame(Frame(Type.DATA, 0, 1, 0, b"ab"))


def test_non_data_length_is_a_value_not_a_body_length() -> None:
    # A WindowUpdate / Ping / GoAway announcing 2**32-1 has no body, whatever max_data is.
    for t in (Type.WINDOW_UPDATE, Type.PING, Type.GO_AWAY):
        raw = encode_header(t, 0, 1, U32) + encode_header(t, 0, 1, 7)
        dec = Decoder(0)
        assert norm(dec.feed(raw)) == [Frame(t, 0, 1, U32), Frame(t, 0, 1, 7)]
        assert dec.pending == 0


def test_unknown_flag_bits_pass_through() -> None:
    # The codec does not interpret flags (hashicorp ignores unknown bits).
    raw = h("00 01 8010 00000001 00000000")
    assert norm(Decoder(MAX).feed(raw)) == [Frame(1, 0x8010, 1, 0)]


def test_data_up_to_max_data_accepted() -> None:
    dec = Decoder(100)
    assert norm(dec.feed(encode_header(0, 0, 1, 100) + body(100))) == [Frame(0, 0, 1, 100, body(100))]
    assert norm(Decoder(0).feed(encode_header(0, 4, 1, 0))) == [Frame(0, 4, 1, 0)]


# -- incremental decoding ----------------------------------------------------------------


def _stream() -> tuple[bytes, list[Frame]]:
    rng = random.Random(5)
    frames = [f for f, _ in VECTORS if f.length != 65536 or f.type != Type.DATA][::3]
    frames += [Frame(0, 0, 3, n, rng.randbytes(n)) for n in (5000, 1, 0, 200)]
    frames += [Frame(0, 0, 1, 65536, BODIES[65536]), Frame(2, 2, 0, 9)]
    return b"".join(encode_frame(f) for f in frames), frames


STREAM, FRAMES = _stream()


def _feed_chunks(chunks: list[bytes], max_data: int = MAX) -> list[Frame]:
    dec = Decoder(max_data)
    out: list[Frame] = []
    for chunk in chunks:
        out += dec.feed(chunk)
        assert dec.pending <= 12 + max_data
    assert dec.pending == 0
    return norm(out)


def test_feed_whole_stream() -> None:
    assert len(FRAMES) > 40
    assert _feed_chunks([STREAM]) == FRAMES


def test_feed_byte_by_byte() -> None:
    assert _feed_chunks([STREAM[i : i + 1] for i in range(len(STREAM))]) == FRAMES


def test_feed_with_empty_chunks() -> None:
    chunks = [b"", STREAM[:3], b"", STREAM[3:12], b"", STREAM[12:1000], b"", STREAM[1000:], b""]
    assert _feed_chunks(chunks) == FRAMES


def test_feed_bytearray_and_memoryview_chunks() -> None:
    half = len(STREAM) // 2
    assert _feed_chunks([bytearray(STREAM[:half]), memoryview(STREAM[half:])]) == FRAMES  # type: ignore[list-item]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_feed_random_splits(data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(STREAM)), max_size=40).map(sorted), label="cuts")
    chunks = [STREAM[a:b] for a, b in pairwise([0, *cuts, len(STREAM)])]
    assert _feed_chunks(chunks) == FRAMES


@pytest.mark.parametrize(
    "frame", [Frame(0, 3, U32, 20, body(20)), Frame(1, 4, 7, 99), Frame(0, 0, 1, 0), Frame(3, 0, 0, 2)]
)
def test_split_anywhere(frame: Frame) -> None:
    data = encode_frame(frame)
    for cut in range(1, len(data)):
        dec = Decoder(MAX)
        assert dec.feed(data[:cut]) == []
        assert dec.pending == cut
        assert norm(dec.feed(data[cut:])) == [frame], cut
        assert dec.pending == 0


def test_body_straddling_feeds() -> None:
    frame = Frame(0, 0, 1, 200, body(200))
    data = encode_frame(frame)
    dec = Decoder(MAX)
    assert dec.feed(data[:53]) == []
    assert dec.pending == 53
    assert dec.feed(data[53:153]) == []
    assert dec.pending == 153
    assert norm(dec.feed(data[153:])) == [frame]
    assert dec.pending == 0


def test_straddling_frame_completed_together_with_further_frames() -> None:
    frames = [Frame(0, 0, 1, 100, b"a" * 100), Frame(1, 0, 1, 10), Frame(0, 4, 1, 2, b"bb")]
    data = b"".join(encode_frame(f) for f in frames)
    dec = Decoder(MAX)
    assert dec.feed(data[:40]) == []
    assert norm(dec.feed(data[40:])) == frames
    assert dec.pending == 0


def test_pending_counts_only_the_incomplete_frame() -> None:
    dec = Decoder(MAX)
    assert dec.feed(encode_header(0, 0, 1, 5)[:7]) == []
    assert dec.pending == 7
    assert dec.feed(encode_header(0, 0, 1, 5)[7:] + b"abc") == []
    assert dec.pending == 15
    nxt = encode_header(1, 0, 1, 9)
    assert norm(dec.feed(b"de" + nxt[:4])) == [Frame(0, 0, 1, 5, b"abcde")]
    assert dec.pending == 4  # only the next frame's first header bytes
    assert norm(dec.feed(nxt[4:])) == [Frame(1, 0, 1, 9)]
    assert dec.pending == 0


def test_pending_stays_bounded_by_one_frame() -> None:
    limit = 300_000
    payload = body(limit)
    header = encode_header(0, 0, 3, limit)
    dec = Decoder(limit)
    assert dec.feed(header + payload[:1000]) == []
    assert dec.pending == 12 + 1000
    for i in range(1000, limit - 50_000, 50_000):
        assert dec.feed(payload[i : i + 50_000]) == []
        assert dec.pending <= 12 + limit
    rest = payload[dec.pending - 12 :]
    nxt = encode_header(0, 0, 3, limit)
    assert norm(dec.feed(rest + nxt + payload[:10])) == [Frame(0, 0, 3, limit, payload)]
    assert dec.pending == 22  # only the next frame's header and first body bytes are kept


# -- zero copy ---------------------------------------------------------------------------


def test_bodies_are_zero_copy_views_of_the_chunk() -> None:
    chunk = (
        encode_frame(Frame(0, 0, 1, 5, b"hello"))
        + encode_frame(Frame(1, 0, 1, 100))  # a WindowUpdate between data frames
        + encode_frame(Frame(0, Flag.SYN | Flag.FIN, U32, 300, body(300)))  # data with flags
        + encode_frame(Frame(0, 0, 2, 0))
        + encode_frame(Frame(0, 0, 2, 65536, BODIES[65536]))
    )
    frames = Decoder(MAX).feed(chunk)
    assert [f.type for f in frames] == [0, 1, 0, 0, 0]
    for frame in frames:
        if frame.type == Type.DATA:
            assert isinstance(frame.body, memoryview)
            assert frame.body.obj is chunk
            assert frame.body.readonly
    assert frames[1].body == b""
    assert bytes(frames[0].body) == b"hello"
    assert bytes(frames[2].body) == body(300)
    assert bytes(frames[3].body) == b""
    assert bytes(frames[4].body) == BODIES[65536]


def test_frames_after_a_straddling_one_are_views_of_the_new_chunk() -> None:
    first = encode_frame(Frame(0, 0, 1, 50, b"a" * 50))
    second = encode_frame(Frame(0, 0, 1, 50, b"b" * 50))
    dec = Decoder(MAX)
    assert dec.feed(first[:20]) == []
    chunk = first[20:] + second
    a, b = dec.feed(chunk)
    assert bytes(a.body) == b"a" * 50
    assert isinstance(b.body, memoryview) and b.body.obj is chunk
    assert bytes(b.body) == b"b" * 50


def test_mutable_input_is_not_aliased() -> None:
    buf = bytearray(encode_frame(Frame(0, 0, 1, 5, b"hello")))
    frames = Decoder(MAX).feed(buf)
    buf[-5:] = b"XXXXX"
    assert bytes(frames[0].body) == b"hello"
    buf2 = bytearray(encode_frame(Frame(0, 0, 1, 5, b"world")))
    frames = Decoder(MAX).feed(memoryview(buf2))
    buf2[-5:] = b"XXXXX"
    assert bytes(frames[0].body) == b"world"


# -- bad input ---------------------------------------------------------------------------

# (id, max_data, hex header, substrings the detail must contain)
BAD_INPUT: list[tuple[str, int, str, list[str]]] = [
    ("version-1", MAX, "01 00 0000 00000001 00000000", ["version is 1", "expected 0"]),
    ("version-1-ping", MAX, "01 02 0001 00000000 00000001", ["version is 1"]),
    ("version-255", MAX, "ff 01 0000 00000001 00000000", ["version is 255"]),
    ("type-4", MAX, "00 04 0000 00000001 00000000", ["unknown type 4", "stream 1"]),
    ("type-4-flags", MAX, "00 04 000f 00000007 00000010", ["unknown type 4", "stream 7"]),
    ("type-255", MAX, "00 ff 0000 ffffffff 00000000", ["unknown type 255", f"stream {U32}"]),
    ("data-101", 100, "00 00 0000 00000001 00000065", ["101 bytes", "stream 1", "100-byte limit"]),
    ("data-101-flags", 100, "00 00 0005 00000003 00000065", ["101 bytes", "stream 3", "100"]),
    ("data-huge", MAX, "00 00 0000 00000002 ffffffff", [f"{U32} bytes", "stream 2", f"{MAX}-byte"]),
    ("data-1-max-0", 0, "00 00 0000 00000001 00000001", ["1 bytes", "stream 1", "0-byte limit"]),
]
BAD_CASES = [pytest.param(*row[1:], id=row[0]) for row in BAD_INPUT]


def _check(err: ProtocolError, needles: list[str], fmt: str = "yamux") -> None:
    assert err.format == fmt
    assert str(err).startswith(f"{fmt}: ")
    for needle in needles:
        assert needle in err.detail, (needle, err.detail)


@pytest.mark.parametrize(("max_data", "data", "needles"), BAD_CASES)
def test_bad_header_alone_raises_protocol_error(max_data: int, data: str, needles: list[str]) -> None:
    # The 12 header bytes alone are fatal: an oversized data length is detected before
    # any of the body arrives.
    with pytest.raises(ProtocolError) as info:
        Decoder(max_data).feed(h(data))
    _check(info.value, needles)


@pytest.mark.parametrize(("max_data", "data", "needles"), BAD_CASES)
def test_bad_header_with_trailing_bytes(max_data: int, data: str, needles: list[str]) -> None:
    with pytest.raises(ProtocolError) as info:
        Decoder(max_data, "yamux-x").feed(h(data) + bytes(200))
    _check(info.value, needles, "yamux-x")


@pytest.mark.parametrize(("max_data", "data", "needles"), BAD_CASES)
def test_bad_header_fed_byte_by_byte(max_data: int, data: str, needles: list[str]) -> None:
    raw = h(data)
    dec = Decoder(max_data)
    for i in range(11):
        assert dec.feed(raw[i : i + 1]) == []  # not decidable before the twelfth byte
    with pytest.raises(ProtocolError) as info:
        dec.feed(raw[11:])
    _check(info.value, needles)


@pytest.mark.parametrize(("max_data", "data", "needles"), BAD_CASES)
def test_bad_header_after_good_frames(max_data: int, data: str, needles: list[str]) -> None:
    good = encode_frame(Frame(1, 0, 1, 5)) + encode_frame(Frame(0, 4, 1, 0))
    with pytest.raises(ProtocolError) as info:
        Decoder(max_data).feed(good + h(data))
    _check(info.value, needles)
    # split across feeds: the good frames come out first
    dec = Decoder(max_data)
    raw = h(data)
    assert norm(dec.feed(good + raw[:5])) == [Frame(1, 0, 1, 5), Frame(0, 4, 1, 0)]
    with pytest.raises(ProtocolError) as info:
        dec.feed(raw[5:])
    _check(info.value, needles)


# -- properties --------------------------------------------------------------------------

_data_frames = st.builds(
    lambda flags, sid, b: Frame(0, flags, sid, len(b), b),
    st.integers(0, 15),
    st.integers(0, U32),
    st.binary(max_size=300),
)
_value_frames = st.builds(
    Frame,
    st.integers(1, 3),
    st.integers(0, 0xFFFF),
    st.integers(0, U32),
    st.integers(0, U32),
    st.just(b""),
)
frames_st = st.one_of(_data_frames, _value_frames)


@settings(max_examples=200, deadline=None)
@given(frame=frames_st)
def test_roundtrip(frame: Frame) -> None:
    encoded = encode_frame(frame)
    assert len(encoded) == 12 + len(frame.body)
    assert encoded[:12] == encode_header(frame.type, frame.flags, frame.stream_id, frame.length)
    dec = Decoder(300)
    assert norm(dec.feed(encoded)) == [frame]
    assert dec.pending == 0


@settings(max_examples=100, deadline=None)
@given(frames=st.lists(frames_st, min_size=1, max_size=8), data=st.data())
def test_roundtrip_sequences_with_splits(frames: list[Frame], data: st.DataObject) -> None:
    encoded = b"".join(encode_frame(f) for f in frames)
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=6).map(sorted), label="cuts")
    chunks = [encoded[a:b] for a, b in pairwise([0, *cuts, len(encoded)])]
    assert _feed_chunks(chunks, 300) == frames


@settings(max_examples=400, deadline=None)
@given(
    chunks=st.lists(st.binary(max_size=40), max_size=6),
    max_data=st.sampled_from([0, 1, 16, 100, MAX]),
)
@example(chunks=[h("01 00 0000 00000001 00000000")], max_data=MAX)
@example(chunks=[h("00 04 0000 00000001"), h("00000000")], max_data=MAX)
@example(chunks=[h("00 00 0000 00000001 00000011")], max_data=16)
@example(chunks=[h("00 00 0000 00000001 0000000a"), b"abc"], max_data=16)
def test_arbitrary_bytes_never_raise_anything_but_protocol_error(chunks: list[bytes], max_data: int) -> None:
    for pieces in (chunks, [b"".join(chunks)]):
        dec = Decoder(max_data)
        try:
            for chunk in pieces:
                for frame in dec.feed(chunk):
                    assert isinstance(frame, Frame)
                    assert 0 <= frame.type <= 3
                    assert 0 <= frame.stream_id <= U32
                    if frame.type == Type.DATA:
                        assert len(frame.body) == frame.length <= max_data
                    else:
                        assert frame.body == b""
                assert dec.pending <= 12 + max_data
        except ProtocolError as exc:
            assert exc.format == "yamux"
