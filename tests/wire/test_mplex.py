"""Tests of the mplex / multiplex codec (:mod:`polymux.wire.mplex`, :mod:`polymux.wire._varint`).

Expected bytes are derived by hand from the format rules (``/work/shared/specs/multiplex.md``
with its erratum ``id = header >> 3``, ``flag = header & 7``; PROTOCOL-NOTES A2), not produced
by the code under test:

* a frame is ``uvarint(id << 3 | flag)``, ``uvarint(len(body))``, ``body``;
* uvarints are unsigned LEB128 (protobuf): seven bits per byte, least significant group
  first, high bit set on every byte but the last.
"""

from __future__ import annotations

import random
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from polymux.exceptions import ProtocolError
from polymux.wire._varint import Incomplete, encode_uvarint, read_uvarint, uvarint_size
from polymux.wire.mplex import (
    MAX_HEADER_VARINT,
    MAX_MESSAGE_SIZE,
    Decoder,
    Flag,
    Frame,
    encode_frame,
    encode_header,
)


FORMATS = ["mplex", "multiplex"]
MIB = 1024 * 1024


def h(text: str) -> bytes:
    """Hex (spaces allowed) to bytes."""
    return bytes.fromhex(text)


def norm(frames: list[Frame]) -> list[Frame]:
    """Frames with their (memoryview) bodies turned into bytes, for plain comparison."""
    return [f._replace(body=bytes(f.body)) for f in frames]


def body(n: int) -> bytes:
    """A recognisable body of ``n`` bytes."""
    return bytes(i % 251 for i in range(n)) if n < 1000 else (bytes(range(251)) * (n // 251 + 1))[:n]


# -- byte vectors ------------------------------------------------------------------------

# The header varint of each id, as a function of the flag (the flag fills the low 3 bits):
#   id 0        -> 0b0000_0fff                        one byte
#   id 1        -> 0b0000_1fff = 0x08 + flag          one byte
#   id 15       -> 0b0111_1fff = 0x78 + flag          one byte (the largest one-byte header)
#   id 16       -> 128 + flag: 0x80 + flag, 0x01      two bytes
#   id 2**60-1  -> 2**63 - 8 + flag: 63 one-bits but the flag's: (0xf8 + flag), seven 0xff, 0x7f
HEADER_HEX = {
    0: lambda f: f"{f:02x}",
    1: lambda f: f"{0x08 + f:02x}",
    15: lambda f: f"{0x78 + f:02x}",
    16: lambda f: f"{0x80 + f:02x} 01",
    2**60 - 1: lambda f: f"{0xF8 + f:02x} ff ff ff ff ff ff ff 7f",
}
LENGTH_HEX = {
    0: "00",
    1: "01",
    127: "7f",
    128: "80 01",
    16383: "ff 7f",
    16384: "80 80 01",
    MIB: "80 80 40",
}
IDS = list(HEADER_HEX)
SIZES = list(LENGTH_HEX)
BODIES = {n: body(n) for n in SIZES}

# Every flag with every id, and every id with every body size: (flag f, i-th id) gets the
# ((f + i) % 7)-th size, a Latin square over 7 flags x 5 ids x 7 sizes.
VECTORS: list[tuple[Frame, str]] = [
    (
        Frame(sid, flag, BODIES[SIZES[(flag + i) % len(SIZES)]]),
        f"{HEADER_HEX[sid](flag)} {LENGTH_HEX[SIZES[(flag + i) % len(SIZES)]]}",
    )
    for flag in range(7)
    for i, sid in enumerate(IDS)
]
# Whole frames spelled out byte by byte, as a check on the table's lambdas.
SPELLED: list[tuple[Frame, str]] = [
    (Frame(0, 0, b""), "00 00"),
    (Frame(0, 0, b"echo"), "00 04 6563686f"),
    (Frame(3, 2, b"hi"), "1a 02 6869"),
    (Frame(16, 6, b""), "86 01 00"),
    (Frame(300, 1, b"x"), "e1 12 01 78"),  # 300 << 3 | 1 = 2401 = 0x961 -> e1 12
    (Frame(2**60 - 1, 6, b""), "fe ff ff ff ff ff ff ff 7f 00"),
    (Frame(2**60 - 1, 0, b"a"), "f8 ff ff ff ff ff ff ff 7f 01 61"),
    (Frame(0, 4, b""), "04 00"),
    (Frame(7, 3, b""), "3b 00"),
    (Frame(1, 5, b"boom"), "0d 04 626f6f6d"),
    (Frame(0, 2, bytes(128)), "02 80 01" + "00" * 128),
]


@pytest.mark.parametrize(("frame", "expected"), SPELLED)
def test_spelled_out_vectors(frame: Frame, expected: str) -> None:
    assert encode_frame(frame) == h(expected)
    assert norm(Decoder().feed(h(expected))) == [frame]
    assert norm(Decoder(fmt="multiplex").feed(h(expected))) == [frame]


def _vector_id(row: tuple[Frame, str]) -> str:
    frame, _ = row
    return f"{Flag(frame.flag).name}-id{frame.stream_id}-len{len(frame.body)}"


VECTOR_IDS = [_vector_id(r) for r in VECTORS]


def test_vector_table_covers_flags_ids_and_sizes() -> None:
    assert {f.flag for f, _ in VECTORS} == set(range(7))
    pairs = {(f.flag, f.stream_id) for f, _ in VECTORS}
    assert pairs >= {(flag, sid) for flag in range(7) for sid in IDS}
    sizes = {(f.stream_id, len(f.body)) for f, _ in VECTORS}
    assert sizes >= {(sid, n) for sid in IDS for n in SIZES}


@pytest.mark.parametrize(("frame", "prefix"), VECTORS, ids=VECTOR_IDS)
def test_encode_frame_vectors(frame: Frame, prefix: str) -> None:
    assert encode_frame(frame) == h(prefix) + bytes(frame.body)


@pytest.mark.parametrize(("frame", "prefix"), VECTORS, ids=VECTOR_IDS)
def test_encode_header_vectors(frame: Frame, prefix: str) -> None:
    assert encode_header(frame.stream_id, frame.flag, len(frame.body)) == h(prefix)


@pytest.mark.parametrize(("frame", "prefix"), VECTORS, ids=VECTOR_IDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_frame_vectors(frame: Frame, prefix: str, fmt: str) -> None:
    dec = Decoder(fmt=fmt)
    assert norm(dec.feed(h(prefix) + bytes(frame.body))) == [frame]
    assert dec.pending == 0


def test_header_varint_lengths() -> None:
    assert len(encode_header(15, 6, 0)) == 2  # one-byte header
    assert len(encode_header(16, 0, 0)) == 3  # two-byte header
    assert len(encode_header(2**60 - 1, 6, 0)) == MAX_HEADER_VARINT + 1
    assert len(encode_header(0, 0, 16383)) == 3
    assert len(encode_header(0, 0, 16384)) == 4


def test_encode_rejects_invalid_frames() -> None:
    with pytest.raises(ValueError, match="flag"):
        encode_header(1, 7, 0)
    with pytest.raises(ValueError, match="flag"):
        encode_header(1, -1, 0)
    with pytest.raises(ValueError, match="stream id"):
        encode_header(2**60, 0, 0)
    with pytest.raises(ValueError, match="stream id"):
        encode_header(-1, 0, 0)
    with pytest.raises(ValueError, match="flag"):
        encode_frame(Frame(0, 7, b"x"))


def test_constants() -> None:
    assert MAX_MESSAGE_SIZE == MIB
    assert MAX_HEADER_VARINT == 9
    assert [int(f) for f in Flag] == list(range(7))
    assert Flag.NEW_STREAM == 0
    assert (Flag.MESSAGE_RECEIVER, Flag.MESSAGE_INITIATOR) == (1, 2)
    assert (Flag.CLOSE_RECEIVER, Flag.CLOSE_INITIATOR) == (3, 4)
    assert (Flag.RESET_RECEIVER, Flag.RESET_INITIATOR) == (5, 6)
    dec = Decoder()
    assert dec.max_message_size == MIB
    assert dec.format == "mplex"
    assert dec.pending == 0


def test_max_message_size_body_accepted_one_more_rejected() -> None:
    dec = Decoder()
    assert norm(dec.feed(h("02 80 80 40") + BODIES[MIB])) == [Frame(0, 2, BODIES[MIB])]
    with pytest.raises(ProtocolError, match="1048577"):
        Decoder().feed(h("02 81 80 40"))
    assert norm(Decoder(100).feed(h("02 64") + body(100))) == [Frame(0, 2, body(100))]


def test_non_minimal_varints_are_accepted() -> None:
    # The references' readers (Go binary.ReadUvarint, varint npm) accept padded varints.
    assert norm(Decoder().feed(h("82 00 80 00"))) == [Frame(0, 2, b"")]
    assert norm(Decoder().feed(h("0a 81 00 78"))) == [Frame(1, 2, b"x")]


# -- uvarints ----------------------------------------------------------------------------

UVARINTS: list[tuple[int, str]] = [
    (0, "00"),
    (1, "01"),
    (127, "7f"),
    (128, "80 01"),
    (300, "ac 02"),
    (16383, "ff 7f"),
    (16384, "80 80 01"),
    (2**63 - 1, "ff ff ff ff ff ff ff ff 7f"),
    (2**63, "80 80 80 80 80 80 80 80 80 01"),
    (2**64 - 1, "ff ff ff ff ff ff ff ff ff 01"),
]


@pytest.mark.parametrize(("value", "expected"), UVARINTS)
def test_encode_uvarint_vectors(value: int, expected: str) -> None:
    assert encode_uvarint(value) == h(expected)


@pytest.mark.parametrize(("value", "expected"), UVARINTS)
def test_uvarint_size_vectors(value: int, expected: str) -> None:
    # (the trace decoder sizes mplex headers with it)
    assert uvarint_size(value) == len(h(expected))


@pytest.mark.parametrize(("value", "expected"), UVARINTS)
def test_read_uvarint_vectors(value: int, expected: str) -> None:
    raw = h(expected)
    assert read_uvarint(raw, 0, len(raw), 10) == (value, len(raw))
    # at an offset, with trailing bytes, and from a memoryview
    padded = b"\xaa\xbb" + raw + b"\x05"
    assert read_uvarint(padded, 2, len(padded), 10) == (value, 2 + len(raw))
    assert read_uvarint(memoryview(padded), 2, len(padded), 10) == (value, 2 + len(raw))


@pytest.mark.parametrize(("value", "expected"), UVARINTS)
def test_read_uvarint_truncated_is_incomplete(value: int, expected: str) -> None:
    raw = h(expected)
    for cut in range(len(raw)):
        with pytest.raises(Incomplete):
            read_uvarint(raw, 0, cut, 10)


def test_read_uvarint_too_long() -> None:
    raw = h("80 80 80 80 80 80 80 80 80 01")  # 2**63: ten bytes
    with pytest.raises(ValueError, match="9"):
        read_uvarint(raw, 0, len(raw), 9)
    # nine continuation bytes already prove it too long for nine bytes, before the tenth
    with pytest.raises(ValueError):
        read_uvarint(raw[:9], 0, 9, 9)
    # eight are not yet conclusive
    with pytest.raises(Incomplete):
        read_uvarint(raw[:8], 0, 8, 9)
    assert read_uvarint(h("ff 7f"), 0, 2, 2) == (16383, 2)
    with pytest.raises(ValueError):
        read_uvarint(h("80 80 01"), 0, 3, 2)


def test_encode_uvarint_rejects_negative() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        encode_uvarint(-1)


@settings(max_examples=200, deadline=None)
@given(value=st.integers(0, 2**70))
def test_uvarint_roundtrip(value: int) -> None:
    raw = encode_uvarint(value)
    assert len(raw) == max(1, -(-value.bit_length() // 7))
    assert all(b & 0x80 for b in raw[:-1]) and not raw[-1] & 0x80
    assert read_uvarint(raw, 0, len(raw), 11) == (value, len(raw))


# -- incremental decoding ----------------------------------------------------------------


def _stream(sizes: set[int]) -> tuple[bytes, list[Frame]]:
    rng = random.Random(7)
    frames = [f for f, _ in VECTORS if len(f.body) in sizes]
    frames += [Frame(3, 2, rng.randbytes(n)) for n in (5000, 1, 0, 200)]
    return b"".join(encode_frame(f) for f in frames), frames


SMALL = {0, 1, 127, 128}
STREAMS = {"small": _stream(SMALL), "full": _stream(set(SIZES))}


def _feed_chunks(chunks: list[bytes], fmt: str = "mplex") -> list[Frame]:
    dec = Decoder(fmt=fmt)
    out: list[Frame] = []
    for chunk in chunks:
        out += dec.feed(chunk)
        assert dec.pending <= 2 * MAX_HEADER_VARINT + MIB
    assert dec.pending == 0
    return norm(out)


@pytest.mark.parametrize("which", ["small", "full"])
def test_feed_whole_stream(which: str) -> None:
    data, expected = STREAMS[which]
    assert _feed_chunks([data]) == expected


def test_feed_byte_by_byte() -> None:
    data, expected = STREAMS["small"]
    assert _feed_chunks([data[i : i + 1] for i in range(len(data))]) == expected


@pytest.mark.parametrize("which", ["small", "full"])
def test_feed_with_empty_chunks(which: str) -> None:
    data, expected = STREAMS[which]
    chunks = [b"", data[:3], b"", data[3:1000], b"", data[1000:], b""]
    assert _feed_chunks(chunks) == expected


@pytest.mark.parametrize("which", ["small", "full"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_feed_random_splits(which: str, data: st.DataObject) -> None:
    stream, expected = STREAMS[which]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40).map(sorted), label="cuts")
    chunks = [stream[a:b] for a, b in pairwise([0, *cuts, len(stream)])]
    assert _feed_chunks(chunks) == expected


@pytest.mark.parametrize("frame", [Frame(2**60 - 1, 6, b"abc"), Frame(16, 2, body(16384))])
def test_split_anywhere_inside_header(frame: Frame) -> None:
    data = encode_frame(frame)
    for cut in range(1, min(16, len(data))):
        dec = Decoder()
        assert dec.feed(data[:cut]) == []
        assert dec.pending == cut
        assert norm(dec.feed(data[cut:])) == [frame], cut
        assert dec.pending == 0


def test_body_straddling_feeds() -> None:
    frame = Frame(1, 2, body(200))
    data = encode_frame(frame)  # 0a c8 01 + 200 bytes
    dec = Decoder()
    assert dec.feed(data[:53]) == []
    assert dec.pending == 53
    assert dec.feed(data[53:153]) == []
    assert dec.pending == 153
    assert norm(dec.feed(data[153:])) == [frame]
    assert dec.pending == 0


def test_straddling_frame_completed_together_with_further_frames() -> None:
    frames = [Frame(1, 2, b"a" * 100), Frame(1, 2, b"b" * 10), Frame(1, 4, b"")]
    data = b"".join(encode_frame(f) for f in frames)
    dec = Decoder()
    assert dec.feed(data[:40]) == []
    assert norm(dec.feed(data[40:])) == frames
    assert dec.pending == 0


# -- truncated input: the decoder waits --------------------------------------------------


@pytest.mark.parametrize(
    "partial",
    [
        "02",  # header only
        "82",  # half a two-byte header
        "80 80 80 80 80 80 80 80",  # eight continuation bytes: a 9-byte header may follow
        "fe ff ff ff ff ff ff ff 7f",  # a whole 9-byte header, no length
        "02 80",  # half a length
        "02 80 80 80 80 80 80 80 80",  # eight continuation bytes of length
        "02 05 61 62",  # part of a body
        "02 80 80 40",  # a 1 MiB body announced, none of it here
    ],
)
def test_truncated_input_is_pending_not_an_error(partial: str) -> None:
    raw = h(partial)
    dec = Decoder()
    assert dec.feed(raw) == []
    assert dec.pending == len(raw)
    # byte by byte, too
    dec = Decoder()
    for i in range(len(raw)):
        assert dec.feed(raw[i : i + 1]) == []
    assert dec.pending == len(raw)


def test_pending_counts_only_the_incomplete_frame() -> None:
    dec = Decoder()
    assert dec.feed(h("02 05")) == []
    assert dec.pending == 2
    assert dec.feed(b"abc") == []
    assert dec.pending == 5
    assert norm(dec.feed(b"de" + h("0a 02 78"))) == [Frame(0, 2, b"abcde")]
    assert dec.pending == 3  # the next frame's header and one body byte
    assert norm(dec.feed(b"y")) == [Frame(1, 2, b"xy")]
    assert dec.pending == 0


def test_pending_stays_bounded_by_one_frame() -> None:
    header = encode_header(1, 2, MIB)
    payload = BODIES[MIB]
    dec = Decoder()
    assert dec.feed(header + payload[:100_000]) == []
    assert dec.pending == len(header) + 100_000
    for i in range(100_000, MIB - 300_000, 300_000):
        assert dec.feed(payload[i : i + 300_000]) == []
        assert dec.pending <= len(header) + MIB
    rest = payload[dec.pending - len(header) :]
    assert norm(dec.feed(rest + header)) == [Frame(1, 2, payload)]
    assert dec.pending == len(header)  # only the next frame's header is kept


# -- zero copy ---------------------------------------------------------------------------


def test_bodies_are_zero_copy_views_of_the_chunk() -> None:
    chunk = (
        encode_frame(Frame(1, 2, b"hello"))
        + encode_frame(Frame(16, 1, body(300)))  # two-byte header and length: slow path
        + encode_frame(Frame(2**60 - 1, 0, b"name"))
        + encode_frame(Frame(1, 4, b""))
    )
    frames = Decoder().feed(chunk)
    assert len(frames) == 4
    for frame in frames:
        assert isinstance(frame.body, memoryview)
        assert frame.body.obj is chunk
        assert frame.body.readonly
    assert bytes(frames[0].body) == b"hello"
    assert bytes(frames[1].body) == body(300)
    assert bytes(frames[2].body) == b"name"


def test_frames_after_a_straddling_one_are_views_of_the_new_chunk() -> None:
    first = encode_frame(Frame(1, 2, b"a" * 50))
    second = encode_frame(Frame(1, 2, b"b" * 50))
    dec = Decoder()
    assert dec.feed(first[:10]) == []
    chunk = first[10:] + second
    a, b = dec.feed(chunk)
    assert bytes(a.body) == b"a" * 50
    assert isinstance(b.body, memoryview) and b.body.obj is chunk
    assert bytes(b.body) == b"b" * 50


def test_mutable_input_is_not_aliased() -> None:
    buf = bytearray(encode_frame(Frame(1, 2, b"hello")))
    frames = Decoder().feed(buf)
    buf[-5:] = b"XXXXX"
    assert bytes(frames[0].body) == b"hello"
    buf2 = bytearray(encode_frame(Frame(1, 2, b"world")))
    frames = Decoder().feed(memoryview(buf2))
    buf2[-5:] = b"XXXXX"
    assert bytes(frames[0].body) == b"world"


# -- bad input ---------------------------------------------------------------------------

# (id, max_message_size, hex bytes, substrings the detail must contain)
BAD_INPUT: list[tuple[str, int, str, list[str]]] = [
    ("header-10-continuation", MIB, "80" * 10, ["header varint", "9"]),
    ("header-9-continuation-alone", MIB, "80" * 9, ["header varint", "9"]),
    ("header-10-bytes-terminated", MIB, "80" * 9 + "01 00", ["header varint", "9"]),
    ("header-10-bytes-ff", MIB, "ff" * 9 + "01 00", ["header varint", "9"]),
    ("length-10-continuation", MIB, "02" + "80" * 10, ["length varint", "9"]),
    ("length-9-continuation-alone", MIB, "0a" + "80" * 9, ["length varint", "9"]),
    ("length-10-bytes-terminated", MIB, "02" + "80" * 9 + "01", ["length varint", "9"]),
    ("length-over-default-max", MIB, "02 81 80 40", ["length 1048577", "1048576", "stream 0"]),
    ("length-huge", MIB, "0a ff ff ff ff ff ff ff ff 7f", [str(2**63 - 1), "stream 1"]),
    ("length-101-alone", 100, "02 65", ["length 101", "100", "stream 0"]),
    ("length-128-body-started", 100, "12 80 01 00 00", ["length 128", "100", "stream 2"]),
    ("length-16384-wide-header", 100, "82 01 80 80 01 00", ["length 16384", "100", "stream 16"]),
    ("length-300-nonzero-flag", 100, "7e ac 02", ["length 300", "100", "stream 15"]),
    ("flag7-07-alone", MIB, "07", ["flag 7", "stream id 0"]),
    ("flag7-07", MIB, "07 00", ["flag 7", "stream id 0"]),
    ("flag7-0f", MIB, "0f 00", ["flag 7", "stream id 1"]),
    ("flag7-0f-body", MIB, "0f 01 78", ["flag 7", "stream id 1"]),
    ("flag7-7f", MIB, "7f 03 616263", ["flag 7", "stream id 15"]),
    ("flag7-two-byte-header", MIB, "ff 01 00", ["flag 7", "stream id 31"]),
    ("flag7-nine-byte-header", MIB, "ff ff ff ff ff ff ff ff 7f 00", ["flag 7", f"stream id {2**60 - 1}"]),
    # One-byte header and one-byte length with the body (partly) at hand: the decoder's fast
    # path must check the limit too.
    ("length-101-body-started", 100, "02 65 00", ["length 101", "100", "stream 0"]),
    ("length-101-whole", 100, "02 65" + "00" * 101, ["length 101", "100", "stream 0"]),
    ("length-127-whole", 100, "0a 7f" + "00" * 127, ["length 127", "100", "stream 1"]),
    ("length-2-max-1", 1, "02 02 61 62", ["length 2", "1", "stream 0"]),
]
BAD_CASES = [pytest.param(*row[1:], id=row[0]) for row in BAD_INPUT]


@pytest.mark.parametrize(("max_size", "data", "needles"), BAD_CASES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_bad_input_raises_protocol_error(fmt: str, max_size: int, data: str, needles: list[str]) -> None:
    with pytest.raises(ProtocolError) as info:
        Decoder(max_size, fmt).feed(h(data))
    err = info.value
    assert err.format == fmt
    assert str(err).startswith(f"{fmt}: ")
    for needle in needles:
        assert needle in err.detail, (needle, err.detail)


@pytest.mark.parametrize(("max_size", "data", "needles"), BAD_CASES)
def test_bad_input_fed_byte_by_byte(max_size: int, data: str, needles: list[str]) -> None:
    raw = h(data)
    dec = Decoder(max_size, "multiplex")
    with pytest.raises(ProtocolError) as info:
        for i in range(len(raw)):
            dec.feed(raw[i : i + 1])
    assert info.value.format == "multiplex"
    for needle in needles:
        assert needle in info.value.detail, (needle, info.value.detail)


@pytest.mark.parametrize(("max_size", "data", "needles"), BAD_CASES)
def test_bad_input_after_good_frames_in_one_feed(max_size: int, data: str, needles: list[str]) -> None:
    good = encode_frame(Frame(1, 2, b"k")) + encode_frame(Frame(1, 4))  # (within max 1)
    with pytest.raises(ProtocolError, match=needles[0]):
        Decoder(max_size).feed(good + h(data))


@pytest.mark.parametrize(("max_size", "data", "needles"), BAD_CASES)
def test_bad_input_split_after_good_frames(max_size: int, data: str, needles: list[str]) -> None:
    raw = h(data)
    dec = Decoder(max_size)
    good = encode_frame(Frame(1, 4))
    with pytest.raises(ProtocolError, match=needles[0]):
        # (a first byte with flag 7 is fatal at once)
        assert norm(dec.feed(good + raw[:1])) == [Frame(1, 4, b"")]
        dec.feed(raw[1:])


@pytest.mark.parametrize(
    "header",
    [
        "02 65",  # 101 > 100
        "02 65 00",  # 101, with one body byte (the decoder's fast path)
        "02 80 01 00",  # 128
        "02 80 80 40 00",  # 1 MiB
    ],
)
def test_oversized_length_detected_from_the_header_alone(header: str) -> None:
    # At most one body byte has arrived: the announced length alone is fatal.
    with pytest.raises(ProtocolError, match="exceeds the maximum message size 100"):
        Decoder(100).feed(h(header))


# -- properties --------------------------------------------------------------------------

frames_st = st.builds(
    Frame,
    st.one_of(st.integers(0, 40), st.integers(0, 2**60 - 1)),
    st.integers(0, 6),
    st.one_of(st.binary(max_size=200), st.integers(16380, 16390).map(body)),
)


@settings(max_examples=200, deadline=None)
@given(frame=frames_st, fmt=st.sampled_from(FORMATS))
def test_roundtrip(frame: Frame, fmt: str) -> None:
    encoded = encode_frame(frame)
    assert encoded == encode_header(frame.stream_id, frame.flag, len(frame.body)) + frame.body
    dec = Decoder(fmt=fmt)
    assert norm(dec.feed(encoded)) == [frame]
    assert dec.pending == 0


@settings(max_examples=100, deadline=None)
@given(
    frames=st.lists(
        st.builds(Frame, st.integers(0, 2**60 - 1), st.integers(0, 6), st.binary(max_size=300)),
        min_size=1,
        max_size=8,
    ),
    data=st.data(),
)
def test_roundtrip_sequences_with_splits(frames: list[Frame], data: st.DataObject) -> None:
    encoded = b"".join(encode_frame(f) for f in frames)
    cuts = data.draw(st.lists(st.integers(0, len(encoded)), max_size=6).map(sorted), label="cuts")
    chunks = [encoded[a:b] for a, b in pairwise([0, *cuts, len(encoded)])]
    assert _feed_chunks(chunks) == frames


@settings(max_examples=400, deadline=None)
@given(
    chunks=st.lists(st.binary(max_size=40), max_size=6),
    max_size=st.sampled_from([1, 16, 100, MIB]),
    fmt=st.sampled_from(FORMATS),
)
@example(chunks=[b"\x07"], max_size=MIB, fmt="mplex")
@example(chunks=[b"\x80" * 10], max_size=MIB, fmt="mplex")
@example(chunks=[b"\x02" + b"\xff" * 10], max_size=MIB, fmt="multiplex")
@example(chunks=[b"\x02\x7f", b"\x00" * 3], max_size=16, fmt="mplex")
def test_arbitrary_bytes_never_raise_anything_but_protocol_error(
    chunks: list[bytes], max_size: int, fmt: str
) -> None:
    for pieces in (chunks, [b"".join(chunks)]):
        dec = Decoder(max_size, fmt)
        try:
            for chunk in pieces:
                for frame in dec.feed(chunk):
                    assert isinstance(frame, Frame)
                    assert 0 <= frame.flag <= 6
                    assert 0 <= frame.stream_id < 2**60
                assert dec.pending <= 2 * MAX_HEADER_VARINT + max(max_size, 127)
        except ProtocolError as exc:
            assert exc.format == fmt
