"""Tests of the MultiplexingStream v1/v2/v3 codec (:mod:`polymux.wire.mstream`).

Expected bytes are derived by hand from the format rules (see the module docstring and
``/work/shared/PROTOCOL-NOTES.md`` A1), not produced by the code under test:

* v1: 7-byte big-endian header ``code:u8 | channel id:i32 | payload length:u16``, then the
  payload.
* v2/v3: one msgpack array per frame in the minimal encoding msgpack-lite (the JS
  reference) and msgpack-python produce; an empty payload element is omitted.

Every v2/v3 vector is cross-checked against ``msgpack.packb`` as an independent encoder.
"""

from __future__ import annotations

import random
import struct
from itertools import pairwise

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from polymux.exceptions import ProtocolError
from polymux.wire.mstream import (
    MAX_PAYLOAD,
    V1_MAGIC,
    ChannelSource,
    ControlCode,
    Decoder,
    Frame,
    Handshake,
    decode_content_processed,
    decode_offer,
    decode_offer_accepted,
    decode_termination,
    decode_window_adjust,
    encode_content_processed,
    encode_frame,
    encode_handshake,
    encode_header,
    encode_offer,
    encode_offer_accepted,
    encode_termination,
    encode_window_adjust,
    format_name,
)


def h(text: str) -> bytes:
    """Hex (spaces allowed) to bytes."""
    return bytes.fromhex(text)


def norm(items: list[Frame | Handshake]) -> list[Frame | Handshake]:
    """Frames with their (memoryview) payloads turned into bytes, for plain comparison."""
    return [item._replace(payload=bytes(item.payload)) if isinstance(item, Frame) else item for item in items]


def envelope(version: int, frame: Frame) -> list[object]:
    """The msgpack array a v2/v3 frame is, for cross-checking with ``msgpack.packb``."""
    elements: list[object] = [frame.code]
    if frame.channel_id is not None:
        elements.append(frame.channel_id)
        if version == 3:
            elements.append(frame.source)
    if frame.payload:
        elements.append(bytes(frame.payload))
    return elements


# Payloads (msgpack minimal encodings, by hand).
ECHO0 = "65 63 68 6f 2f 30"  # "echo/0"
ERROR_BOOM = "45 72 72 6f 72 3a 20 62 6f 6f 6d"  # "Error: boom" (11 bytes)
OFFER_ECHO0_102400 = f"92 a6 {ECHO0} ce 00 01 90 00"  # ["echo/0", 102400], 13 bytes
ACCEPTED_102400 = "91 ce 00 01 90 00"  # [102400], 6 bytes
TERMINATED_BOOM = f"91 ab {ERROR_BOOM}"  # ["Error: boom"], 13 bytes
PROCESSED_20480 = "91 cd 50 00"  # [20480], 4 bytes
PROCESSED_5 = "91 05"  # [5]
ADJUST_409600 = "91 ce 00 06 40 00"  # [409600], 6 bytes

BIG = bytes(range(256)) + b"\xab\xcd"  # 258 bytes: needs u16 0x0102 / bin16 in the header

# (version, frame, expected hex). One row per control code 0..8 for each version, plus a few
# extra rows for encodings that only show with other sizes.
VECTORS: list[tuple[int, Frame, str]] = [
    # ---- v1: code | id (i32 BE) | length (u16 BE) | payload
    (1, Frame(0, 1, b"echo/0"), f"00 00000001 0006 {ECHO0}"),
    (1, Frame(1, 1), "01 00000001 0000"),
    (1, Frame(2, 3, b"hi"), "02 00000003 0002 6869"),
    (1, Frame(3, 2), "03 00000002 0000"),
    (1, Frame(4, 0x01020304), "04 01020304 0000"),
    (1, Frame(5, 1, h(PROCESSED_5)), f"05 00000001 0002 {PROCESSED_5}"),
    (1, Frame(6, 0x7FFFFFFF), "06 7fffffff 0000"),
    (1, Frame(7, 5, h(ADJUST_409600)), f"07 00000005 0006 {ADJUST_409600}"),
    (1, Frame(8, 1), "08 00000001 0000"),
    (1, Frame(2, 1, BIG), "02 00000001 0102" + BIG.hex()),
    (1, Frame(0xFF, 0), "ff 00000000 0000"),
    # ---- v2: [code], [code, id], [code, id, bin(payload)]
    (2, Frame(0, 1, h(OFFER_ECHO0_102400)), f"93 00 01 c4 0d {OFFER_ECHO0_102400}"),
    (2, Frame(1, 1, h(ACCEPTED_102400)), f"93 01 01 c4 06 {ACCEPTED_102400}"),
    (2, Frame(2, 2, b"hi"), "93 02 02 c4 02 6869"),
    (2, Frame(3, 1), "92 03 01"),
    # JS: channel.dispose(new Error('boom')) -> [4, id, bin(msgpack ["Error: boom"])]
    (2, Frame(4, 3, h(TERMINATED_BOOM)), f"93 04 03 c4 0d {TERMINATED_BOOM}"),
    # JS: every Content frame is acknowledged with ContentProcessed [n]
    (2, Frame(5, 1, h(PROCESSED_20480)), f"93 05 01 c4 04 {PROCESSED_20480}"),
    (2, Frame(6, 200), "92 06 cc c8"),
    (2, Frame(7, 70000, h(ADJUST_409600)), f"93 07 ce 00011170 c4 06 {ADJUST_409600}"),
    (2, Frame(8, 2**32), "92 08 cf 0000000100000000"),
    (2, Frame(4, 1), "92 04 01"),  # dispose() without error / rejectChannel
    (2, Frame(8), "91 08"),
    (2, Frame(2, 2**64 - 1, BIG), "93 02 cf ffffffffffffffff c5 0102" + BIG.hex()),
    # ---- v3: [code], [code, id, source], [code, id, source, bin(payload)]
    # The reference JS peer's Offer of "echo/0" with its default window of 102400.
    (3, Frame(0, 1, h(OFFER_ECHO0_102400), 1), f"94 00 01 01 c4 0d {OFFER_ECHO0_102400}"),
    # The JS responder accepting that channel (remote from its perspective: source -1).
    (3, Frame(1, 1, h(ACCEPTED_102400), -1), f"94 01 01 ff c4 06 {ACCEPTED_102400}"),
    (3, Frame(2, 1, b"hi", 1), "94 02 01 01 c4 02 6869"),
    (3, Frame(3, 1, b"", -1), "93 03 01 ff"),
    (3, Frame(4, 1, h(TERMINATED_BOOM), -1), f"94 04 01 ff c4 0d {TERMINATED_BOOM}"),
    (3, Frame(5, 1, h(PROCESSED_20480), -1), f"94 05 01 ff c4 04 {PROCESSED_20480}"),
    (3, Frame(6, 0, b"", 0), "93 06 00 00"),  # seeded channel 0
    (3, Frame(7, 300, h(ADJUST_409600), 1), f"94 07 cd 012c 01 c4 06 {ADJUST_409600}"),
    (3, Frame(8, 2**64 - 1, b"", -1), "93 08 cf ffffffffffffffff ff"),
    (3, Frame(5, 7, h(PROCESSED_5), 1), f"94 05 07 01 c4 02 {PROCESSED_5}"),
    (3, Frame(4, 1, b"", 1), "93 04 01 01"),
    (3, Frame(3), "91 03"),
    (3, Frame(2, 1, BIG, 0), "94 02 01 00 c5 0102" + BIG.hex()),
]


def _vector_id(row: tuple[int, Frame, str]) -> str:
    version, frame, _ = row
    try:
        name = ControlCode(frame.code).name
    except ValueError:
        name = f"code{frame.code}"
    return f"v{version}-{name}-id{frame.channel_id}-src{frame.source}-len{len(frame.payload)}"


def test_vector_table_covers_every_code_in_every_version() -> None:
    for version in (1, 2, 3):
        codes = {frame.code for v, frame, _ in VECTORS if v == version}
        assert codes >= set(range(9)), version


@pytest.mark.parametrize(("version", "frame", "expected"), VECTORS, ids=[_vector_id(r) for r in VECTORS])
def test_encode_frame_vectors(version: int, frame: Frame, expected: str) -> None:
    assert encode_frame(version, frame) == h(expected)


@pytest.mark.parametrize(("version", "frame", "expected"), VECTORS, ids=[_vector_id(r) for r in VECTORS])
def test_encode_header_plus_payload_equals_frame(version: int, frame: Frame, expected: str) -> None:
    header = encode_header(version, frame.code, frame.channel_id, len(frame.payload), frame.source)
    assert header + bytes(frame.payload) == h(expected)


@pytest.mark.parametrize(("version", "frame", "expected"), VECTORS, ids=[_vector_id(r) for r in VECTORS])
def test_decode_frame_vectors(version: int, frame: Frame, expected: str) -> None:
    assert norm(Decoder(version, handshake=False).feed(h(expected))) == [frame]


@pytest.mark.parametrize(
    ("version", "frame", "expected"),
    [r for r in VECTORS if r[0] != 1],
    ids=[_vector_id(r) for r in VECTORS if r[0] != 1],
)
def test_vectors_match_msgpack_python(version: int, frame: Frame, expected: str) -> None:
    assert msgpack.packb(envelope(version, frame), use_bin_type=True) == h(expected)


def test_v1_header_matches_struct_layout() -> None:
    assert encode_header(1, 2, 0x0A0B0C0D, 0x1234) == struct.pack(">BiH", 2, 0x0A0B0C0D, 0x1234)
    assert encode_header(1, 2, None, 0) == h("02 00000000 0000")


def test_reference_payload_vectors() -> None:
    assert encode_offer(3, "echo/0", 102400) == h(OFFER_ECHO0_102400)
    assert encode_offer_accepted(3, 102400) == h(ACCEPTED_102400)
    assert encode_termination(2, "Error: boom") == h(TERMINATED_BOOM)
    assert encode_content_processed(20480) == h(PROCESSED_20480)
    assert encode_content_processed(5) == h(PROCESSED_5)
    assert encode_window_adjust(409600) == h(ADJUST_409600)
    # The complete v3 Offer frame as nerdbank-streams (JS) sends it.
    offer = Frame(ControlCode.OFFER, 1, encode_offer(3, "echo/0", 102400), ChannelSource.LOCAL)
    assert encode_frame(3, offer) == h("94 00 01 01 c4 0d 92 a6") + b"echo/0" + h("ce 00 01 90 00")


# Non-minimal but valid msgpack that other encoders may produce must decode too.
NON_MINIMAL: list[tuple[int, str, Frame]] = [
    (2, "dc 0002 02 05", Frame(2, 5)),  # array16 header
    (2, "93 d0 02 cd 0001 c5 0002 6869", Frame(2, 1, b"hi")),  # int8 code, uint16 id, bin16
    (2, "92 03 c0", Frame(3, None)),  # [code, nil]
    (3, "94 02 01 d0 ff c6 00000002 6869", Frame(2, 1, b"hi", -1)),  # int8 source, bin32
    (3, "93 03 ce 00000001 d0 01", Frame(3, 1, b"", 1)),
    (3, "dc 0001 cc 08", Frame(8)),
]


@pytest.mark.parametrize(("version", "data", "frame"), NON_MINIMAL)
def test_decode_accepts_non_minimal_msgpack(version: int, data: str, frame: Frame) -> None:
    assert norm(Decoder(version, handshake=False).feed(h(data))) == [frame]


def test_decoder_keeps_unknown_codes() -> None:
    # The reference readers skip unknown codes, so the decoder must hand them up intact.
    assert norm(Decoder(2, handshake=False).feed(h("92 cc 63 01"))) == [Frame(99, 1)]
    assert norm(Decoder(1, handshake=False).feed(h("63 00000001 0000"))) == [Frame(99, 1)]


def test_encode_rejects_invalid_frames() -> None:
    with pytest.raises(ValueError, match="20481"):
        encode_header(2, 2, 1, MAX_PAYLOAD + 1)
    with pytest.raises(ValueError, match="20481"):
        encode_header(1, 2, 1, MAX_PAYLOAD + 1)
    with pytest.raises(ValueError, match="channel id"):
        encode_frame(2, Frame(2, None, b"x"))
    with pytest.raises(ValueError, match="channel id"):
        encode_frame(3, Frame(2, None, b"x"))
    with pytest.raises(ValueError, match="source"):
        encode_frame(3, Frame(2, 1, b"x"))  # v3 frame with an id needs a source
    with pytest.raises(ValueError, match="source"):
        encode_frame(3, Frame(2, 1, b"x", 2))


def test_constants() -> None:
    assert MAX_PAYLOAD == 20480
    assert V1_MAGIC == h("2f df 1d 50")
    assert [format_name(v) for v in (1, 2, 3)] == ["mstream-v1", "mstream-v2", "mstream-v3"]
    assert [int(c) for c in ControlCode] == list(range(9))
    assert (ChannelSource.LOCAL, ChannelSource.REMOTE, ChannelSource.SEEDED) == (1, -1, 0)
    with pytest.raises(ValueError):
        Decoder(4)


# -- handshakes ----------------------------------------------------------------------------

RANDOM16 = bytes(range(0xA0, 0xB0))


def test_v1_handshake() -> None:
    data = encode_handshake(1, RANDOM16)
    assert data == h("2f df 1d 50") + RANDOM16
    assert len(data) == 20
    assert Decoder(1).feed(data) == [Handshake((1, 0), RANDOM16)]


def test_v2_handshake() -> None:
    data = encode_handshake(2, RANDOM16)
    assert data == h("92 92 02 00 c4 10") + RANDOM16
    assert data == msgpack.packb([[2, 0], RANDOM16], use_bin_type=True)
    assert Decoder(2).feed(data) == [Handshake((2, 0), RANDOM16)]


def test_v2_handshake_other_version_is_decoded_not_judged() -> None:
    # Comparing versions is the engine's job; the codec reports what was sent.
    data = msgpack.packb([[3, 1], RANDOM16], use_bin_type=True)
    assert Decoder(2).feed(data) == [Handshake((3, 1), RANDOM16)]


def test_v3_has_no_handshake() -> None:
    with pytest.raises(ValueError, match="mstream-v3"):
        encode_handshake(3, RANDOM16)
    # handshake=True is ignored for v3: the first bytes are already a frame.
    assert norm(Decoder(3).feed(h("93 03 01 ff"))) == [Frame(3, 1, b"", -1)]


@pytest.mark.parametrize("version", [1, 2])
def test_handshake_random_must_be_16_bytes(version: int) -> None:
    with pytest.raises(ValueError, match="16"):
        encode_handshake(version, bytes(15))
    with pytest.raises(ValueError, match="16"):
        encode_handshake(version, bytes(17))


@pytest.mark.parametrize("version", [1, 2])
def test_handshake_then_frames_in_one_feed(version: int) -> None:
    frames = [Frame(0, 1, encode_offer(version, "a", None)), Frame(2, 1, b"data"), Frame(3, 1)]
    data = encode_handshake(version, RANDOM16) + b"".join(encode_frame(version, f) for f in frames)
    assert norm(Decoder(version).feed(data)) == [Handshake((version, 0), RANDOM16), *frames]


@pytest.mark.parametrize("version", [1, 2])
def test_handshake_is_only_expected_once(version: int) -> None:
    dec = Decoder(version)
    assert dec.feed(encode_handshake(version, RANDOM16)) == [Handshake((version, 0), RANDOM16)]
    # A second handshake's bytes are now read as frames (or rejected), never as a handshake.
    frame = Frame(3, 1)
    assert norm(dec.feed(encode_frame(version, frame))) == [frame]


# -- payload helpers -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "echo/0", "héllo/✓ 日本", "x" * 300])
def test_offer_v1_is_raw_utf8(name: str) -> None:
    payload = encode_offer(1, name, 102400)  # v1 has no window: it is dropped
    assert payload == name.encode("utf-8")
    assert decode_offer(1, payload) == (name, None)
    assert decode_offer(1, memoryview(payload)) == (name, None)


def test_offer_v1_non_utf8_is_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="mstream-v1") as info:
        decode_offer(1, b"\xff\xfe")
    assert info.value.format == "mstream-v1"
    assert "UTF-8" in info.value.detail


@pytest.mark.parametrize("version", [2, 3])
def test_offer_v2_v3(version: int) -> None:
    assert encode_offer(version, "echo/0", None) == h(f"91 a6 {ECHO0}")
    assert encode_offer(version, "echo/0", 102400) == h(OFFER_ECHO0_102400)
    assert encode_offer(version, "héllo", 7) == msgpack.packb(["héllo", 7])
    assert decode_offer(version, h(f"91 a6 {ECHO0}")) == ("echo/0", None)
    assert decode_offer(version, memoryview(h(OFFER_ECHO0_102400))) == ("echo/0", 102400)
    assert decode_offer(version, encode_offer(version, "héllo/✓", 1_024_000)) == ("héllo/✓", 1_024_000)
    assert decode_offer(version, b"") == ("", None)


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (msgpack.packb([]), "name"),
        (msgpack.packb([5]), "name"),
        (msgpack.packb(["a", -1]), "receivingWindow"),
        (msgpack.packb(["a", "big"]), "receivingWindow"),
        (msgpack.packb(["a", True]), "receivingWindow"),
        (msgpack.packb({"a": 1}), "array"),
        (b"\xc1", "msgpack"),
        (msgpack.packb(["a"]) + b"\x00", "msgpack"),  # trailing bytes
    ],
)
def test_offer_v2_bad_payloads(payload: bytes, needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle) as info:
        decode_offer(2, payload)
    assert info.value.format == "mstream-v2"
    assert "Offer" in str(info.value)


def test_offer_accepted() -> None:
    assert encode_offer_accepted(1, 102400) == b""
    assert decode_offer_accepted(1, b"") is None
    assert decode_offer_accepted(1, b"anything") is None
    for version in (2, 3):
        assert encode_offer_accepted(version, None) == b""
        assert encode_offer_accepted(version, 102400) == h(ACCEPTED_102400)
        assert decode_offer_accepted(version, h(ACCEPTED_102400)) == 102400
        assert decode_offer_accepted(version, memoryview(h(ACCEPTED_102400))) == 102400
        assert decode_offer_accepted(version, b"") is None
        assert decode_offer_accepted(version, h("90")) is None  # []
        with pytest.raises(ProtocolError, match="receivingWindow"):
            decode_offer_accepted(version, msgpack.packb([-5]))


def test_content_processed() -> None:
    for n in (0, 5, 127, 128, 20480, 2**32, 2**63 - 1):
        payload = encode_content_processed(n)
        assert payload == msgpack.packb([n])
        assert decode_content_processed(2, payload) == n
        assert decode_content_processed(3, memoryview(payload)) == n
    with pytest.raises(ProtocolError, match="mstream-v3: ContentProcessed payload is an empty array"):
        decode_content_processed(3, h("90"))
    with pytest.raises(ProtocolError, match=r"bytesProcessed is invalid: -1") as info:
        decode_content_processed(2, msgpack.packb([-1]))
    assert info.value.format == "mstream-v2"
    with pytest.raises(ProtocolError, match="ContentProcessed payload must be a msgpack array"):
        decode_content_processed(2, msgpack.packb(5))
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        decode_content_processed(2, b"")


def test_window_adjust() -> None:
    assert encode_window_adjust(409600) == h(ADJUST_409600)
    assert decode_window_adjust(2, h(ADJUST_409600)) == 409600
    assert decode_window_adjust(3, encode_window_adjust(0)) == 0
    with pytest.raises(ProtocolError, match="ChannelWindowAdjust payload is an empty array"):
        decode_window_adjust(3, h("90"))
    with pytest.raises(ProtocolError, match=r"window is invalid: 'x'"):
        decode_window_adjust(3, msgpack.packb(["x"]))


def test_termination() -> None:
    # v1 never carries error text, in either direction.
    assert encode_termination(1, "Error: boom") == b""
    assert decode_termination(1, h(TERMINATED_BOOM)) is None
    assert decode_termination(1, b"") is None
    for version in (2, 3):
        assert encode_termination(version, None) == b""
        assert encode_termination(version, "") == b""
        assert encode_termination(version, "Error: boom") == h(TERMINATED_BOOM)
        assert decode_termination(version, h(TERMINATED_BOOM)) == "Error: boom"
        assert decode_termination(version, memoryview(h(TERMINATED_BOOM))) == "Error: boom"
        assert decode_termination(version, b"") is None
        assert decode_termination(version, h("90")) is None
        assert decode_termination(version, msgpack.packb(["ünï ✓"])) == "ünï ✓"
        with pytest.raises(ProtocolError, match=r"ChannelTerminated field error is not a string: 5"):
            decode_termination(version, msgpack.packb([5]))


# -- incremental decoding ------------------------------------------------------------------


def _stream(version: int, handshake: bool) -> tuple[bytes, list[Frame | Handshake]]:
    """A byte stream with the table's frames of ``version``, plus large payloads."""
    rng = random.Random(version)
    big = rng.randbytes(MAX_PAYLOAD)
    frames = [f for v, f, _ in VECTORS if v == version]
    source = 1 if version == 3 else None
    frames += [
        Frame(2, 9, big, source),
        Frame(2, 9, rng.randbytes(5000), source),
        Frame(2, 9, b"z", source),
        Frame(2, 9, big[::-1], source),
    ]
    items: list[Frame | Handshake] = list(frames)
    data = b"".join(encode_frame(version, f) for f in frames)
    if handshake:
        items.insert(0, Handshake((version, 0), RANDOM16))
        data = encode_handshake(version, RANDOM16) + data
    return data, items


STREAM_CASES = [(1, False), (1, True), (2, False), (2, True), (3, False)]
STREAMS = {case: _stream(*case) for case in STREAM_CASES}


def _feed_chunks(version: int, handshake: bool, chunks: list[bytes]) -> list[Frame | Handshake]:
    dec = Decoder(version, handshake=handshake)
    out: list[Frame | Handshake] = []
    for chunk in chunks:
        out += dec.feed(chunk)
    return norm(out)


@pytest.mark.parametrize(("version", "handshake"), STREAM_CASES)
def test_feed_whole_stream(version: int, handshake: bool) -> None:
    data, expected = STREAMS[version, handshake]
    assert _feed_chunks(version, handshake, [data]) == expected


@pytest.mark.parametrize(("version", "handshake"), STREAM_CASES)
def test_feed_byte_by_byte(version: int, handshake: bool) -> None:
    data, expected = STREAMS[version, handshake]
    chunks = [data[i : i + 1] for i in range(len(data))]
    assert _feed_chunks(version, handshake, chunks) == expected


@pytest.mark.parametrize(("version", "handshake"), STREAM_CASES)
def test_feed_with_empty_chunks(version: int, handshake: bool) -> None:
    data, expected = STREAMS[version, handshake]
    chunks = [b"", data[:3], b"", data[3:1000], b"", data[1000:], b""]
    assert _feed_chunks(version, handshake, chunks) == expected


@pytest.mark.parametrize(("version", "handshake"), STREAM_CASES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_feed_random_splits(version: int, handshake: bool, data: st.DataObject) -> None:
    stream, expected = STREAMS[version, handshake]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40).map(sorted), label="cuts")
    bounds = [0, *cuts, len(stream)]
    chunks = [stream[a:b] for a, b in pairwise(bounds)]
    assert _feed_chunks(version, handshake, chunks) == expected


@pytest.mark.parametrize("version", [1, 2, 3])
def test_payload_straddling_feeds(version: int) -> None:
    frame = Frame(2, 1, bytes(range(200)), 1 if version == 3 else None)
    data = encode_frame(version, frame)
    header_len = len(data) - 200
    dec = Decoder(version, handshake=False)
    assert dec.feed(data[: header_len + 50]) == []
    assert dec.feed(data[header_len + 50 : header_len + 150]) == []
    assert norm(dec.feed(data[header_len + 150 :])) == [frame]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_straddling_frame_completed_together_with_further_frames(version: int) -> None:
    src = 1 if version == 3 else None
    frames = [Frame(2, 1, b"a" * 100, src), Frame(2, 1, b"b" * 10, src), Frame(3, 1, b"", src)]
    data = b"".join(encode_frame(version, f) for f in frames)
    dec = Decoder(version, handshake=False)
    assert dec.feed(data[:40]) == []
    assert norm(dec.feed(data[40:])) == frames


@pytest.mark.parametrize("version", [1, 2, 3])
def test_split_inside_header(version: int) -> None:
    frame = Frame(7, 2**31 - 1, encode_window_adjust(409600), -1 if version == 3 else None)
    data = encode_frame(version, frame)
    for cut in range(1, len(data)):
        dec = Decoder(version, handshake=False)
        assert dec.feed(data[:cut]) == []
        assert norm(dec.feed(data[cut:])) == [frame], cut


@pytest.mark.parametrize("version", [1, 2, 3])
def test_max_payload_accepted(version: int) -> None:
    payload = bytes(range(256)) * (MAX_PAYLOAD // 256)
    assert len(payload) == 20480
    frame = Frame(2, 1, payload, 1 if version == 3 else None)
    data = encode_frame(version, frame)
    expected_header = {1: "02 00000001 5000", 2: "93 02 01 c5 5000", 3: "94 02 01 01 c5 5000"}[version]
    assert data[: len(data) - MAX_PAYLOAD] == h(expected_header)
    assert norm(Decoder(version, handshake=False).feed(data)) == [frame]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_partial_buffer_stays_bounded(version: int) -> None:
    source = 1 if version == 3 else None
    header = encode_header(version, 2, 1, MAX_PAYLOAD, source)
    payload = bytes(range(256)) * (MAX_PAYLOAD // 256)
    dec = Decoder(version, handshake=False)
    assert dec.feed(header + payload[:20000]) == []
    # White-box: the decoder holds at most one frame's worth of bytes.
    assert dec.pending <= len(header) + MAX_PAYLOAD
    for i in range(20000, 20400, 100):
        assert dec.feed(payload[i : i + 100]) == []
        assert dec.pending <= len(header) + MAX_PAYLOAD
    assert norm(dec.feed(payload[20400:] + header)) == [Frame(2, 1, payload, source)]
    assert dec.pending == len(header)  # only the next frame's header is kept


# -- zero copy -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3])
def test_payload_is_zero_copy_view(version: int) -> None:
    # The decoder slices a memoryview over the chunk it was handed instead of copying the
    # payload out, so Content of up to 20 KiB per frame reaches the application without a
    # copy. That is only safe because the chunk is immutable ``bytes`` (see the next test).
    src = 1 if version == 3 else None
    chunk = encode_frame(version, Frame(2, 1, b"hello", src)) + encode_frame(version, Frame(2, 1, b"x", src))
    frames = Decoder(version, handshake=False).feed(chunk)
    assert len(frames) == 2
    for frame in frames:
        assert isinstance(frame, Frame)
        assert isinstance(frame.payload, memoryview)
        assert frame.payload.obj is chunk  # a view of the very object that was fed
        assert frame.payload.readonly
    assert frames[0].payload == b"hello"


@pytest.mark.parametrize("version", [1, 2, 3])
def test_mutable_input_is_not_aliased(version: int) -> None:
    # bytearray/memoryview input is copied to bytes first, so a caller reusing its read
    # buffer cannot change payloads it already received.
    buf = bytearray(encode_frame(version, Frame(2, 1, b"hello", 1 if version == 3 else None)))
    frames = Decoder(version, handshake=False).feed(buf)
    buf[-5:] = b"XXXXX"
    assert bytes(frames[0].payload) == b"hello"
    buf2 = bytearray(encode_frame(version, Frame(2, 1, b"world", 1 if version == 3 else None)))
    frames = Decoder(version, handshake=False).feed(memoryview(buf2))
    buf2[-5:] = b"XXXXX"
    assert bytes(frames[0].payload) == b"world"


# -- bad input -----------------------------------------------------------------------------


BAD_INPUT: list[tuple[str, int, bool, str, list[str]]] = [
    # (id, version, handshake, hex bytes, substrings the message must contain)
    ("v1-length-20481", 1, False, "02 00000001 5001", ["payload length", "20481"]),
    ("v1-length-65535", 1, False, "02 00000001 ffff", ["payload length", "65535"]),
    ("v1-negative-id", 1, False, "02 ffffffff 0000", ["channel id", "-1"]),
    ("v2-bin16-20481", 2, False, "93 02 01 c5 5001", ["payload length", "20481"]),
    ("v2-bin32-huge", 2, False, "93 02 01 c6 ffffffff", ["payload length", "4294967295"]),
    ("v3-bin16-20481", 3, False, "94 02 01 01 c5 5001", ["payload length", "20481"]),
    ("v3-bin32-20481", 3, False, "94 02 01 01 c6 00005001", ["payload length", "20481"]),
    ("v2-map", 2, False, "81 a1 61 01", ["array", "0x81"]),
    ("v3-map", 3, False, "80", ["array", "0x80"]),
    ("v2-string", 2, False, "a3 616263", ["array", "0xa3"]),
    ("v3-int", 3, False, "05", ["array", "0x05"]),
    ("v2-garbage-c1", 2, False, "c1", ["array", "0xc1"]),
    ("v3-garbage-c1", 3, False, "c1", ["array", "0xc1"]),
    ("v2-0-elements", 2, False, "90", ["elements", "0"]),
    ("v2-4-elements", 2, False, "94 02 01 01 c4 00", ["elements", "4"]),
    ("v3-2-elements", 3, False, "92 02 01", ["elements", "2"]),
    ("v3-5-elements", 3, False, "95 02 01 01 c4 00 00", ["elements", "5"]),
    ("v2-array16-0-elements", 2, False, "dc 0000", ["elements", "0"]),
    ("v2-code-str", 2, False, "92 a1 61 01", ["code", "0xa1"]),
    ("v3-code-float", 3, False, "91 ca 00000000", ["code", "0xca"]),
    ("v2-code-nil", 2, False, "91 c0", ["code", "None"]),
    ("v2-code-negative", 2, False, "91 ff", ["code", "-1"]),
    ("v2-code-bool", 2, False, "91 c3", ["code", "0xc3"]),
    ("v2-id-negative", 2, False, "92 02 ff", ["channelId", "-1"]),
    ("v2-id-negative-int64", 2, False, "92 02 d3 8000000000000000", ["channelId", str(-(2**63))]),
    ("v3-id-negative", 3, False, "93 02 d0 80 01", ["channelId", "-128"]),
    ("v3-id-nil", 3, False, "93 02 c0 01", ["channelId", "nil"]),
    ("v2-id-str", 2, False, "92 02 a1 31", ["channelId", "0xa1"]),
    ("v3-source-5", 3, False, "93 02 01 05", ["source", "5"]),
    ("v3-source--2", 3, False, "93 02 01 fe", ["source", "-2"]),
    ("v3-source-nil", 3, False, "93 02 01 c0", ["source", "None"]),
    ("v2-payload-str", 2, False, "93 02 01 a3 616263", ["payload", "bin", "0xa3"]),
    ("v3-payload-str", 3, False, "94 02 01 01 a3 616263", ["payload", "bin", "0xa3"]),
    ("v2-payload-int", 2, False, "93 02 01 05", ["payload", "bin", "0x05"]),
    ("v2-payload-without-id", 2, False, "93 02 c0 c4 01 61", ["payload", "channel id"]),
    ("v1-bad-magic", 1, True, "deadbeef" + "00" * 16, ["magic", "deadbeef", "2fdf1d50"]),
    ("v2-handshake-map", 2, True, "82 00 00 01 01", ["handshake", "array", "0x82"]),
    ("v2-handshake-str", 2, True, "a1 61", ["handshake", "array", "0xa1"]),
    ("v2-handshake-garbage-c1", 2, True, "c1", ["handshake", "0xc1"]),
    ("v2-handshake-version-int", 2, True, "92 02 c4 10" + "00" * 16, ["handshake", "version", "0x02"]),
    ("v2-handshake-random-15", 2, True, "92 92 02 00 c4 0f" + "00" * 15, ["handshake", "random"]),
    ("v2-handshake-random-str", 2, True, "92 92 02 00 b0" + "61" * 16, ["handshake", "random"]),
    ("v2-handshake-version-nil", 2, True, "92 92 c0 00 c4 10" + "00" * 16, ["handshake", "version"]),
    ("v2-handshake-version-str", 2, True, "92 92 a1 32 00 c4 10" + "00" * 16, ["version.major", "0xa1"]),
]


@pytest.mark.parametrize(
    ("version", "handshake", "data", "needles"),
    [row[1:] for row in BAD_INPUT],
    ids=[row[0] for row in BAD_INPUT],
)
def test_bad_input_raises_protocol_error(
    version: int, handshake: bool, data: str, needles: list[str]
) -> None:
    with pytest.raises(ProtocolError) as info:
        Decoder(version, handshake=handshake).feed(h(data))
    err = info.value
    assert err.format == f"mstream-v{version}"
    assert str(err).startswith(f"mstream-v{version}: ")
    for needle in needles:
        assert needle in err.detail, (needle, err.detail)


def test_v2_handshake_random_error_names_the_length() -> None:
    with pytest.raises(ProtocolError) as info:
        Decoder(2).feed(h("92 92 02 00 c4 0f") + bytes(15))
    assert "15" in info.value.detail or "0x0f" in info.value.detail


@pytest.mark.parametrize(
    ("version", "header"),
    [(1, "02 00000001 5001"), (2, "93 02 01 c5 5001"), (3, "94 02 01 01 c5 5001")],
)
def test_oversized_payload_detected_from_header_alone(version: int, header: str) -> None:
    # No payload byte has arrived: the announced length alone is fatal. Also when the
    # header itself arrives in pieces.
    with pytest.raises(ProtocolError, match="20481"):
        Decoder(version, handshake=False).feed(h(header))
    # ... and when the first payload bytes come with it (v2/v3: the fast path's shape)
    with pytest.raises(ProtocolError, match=f"mstream-v{version}: frame payload length 20481 exceeds"):
        Decoder(version, handshake=False).feed(h(header) + b"ab")
    dec = Decoder(version, handshake=False)
    raw = h(header)
    with pytest.raises(ProtocolError, match="20481"):
        for i in range(len(raw)):
            dec.feed(raw[i : i + 1])


def test_array16_header_split_inside_its_count() -> None:
    # [2, 1, bin(b"hi")] with an array16 header (valid msgpack, not minimal): the count's
    # two bytes arrive in two reads.
    raw = h("dc 0003 02 01 c4 02") + b"hi"
    dec = Decoder(2, handshake=False)
    assert dec.feed(raw[:2]) == []
    assert dec.pending == 2
    assert norm(dec.feed(raw[2:])) == [Frame(2, 1, b"hi")]


def test_bad_frame_after_good_ones_in_same_feed() -> None:
    with pytest.raises(ProtocolError, match="mstream-v2: frame array has 0 elements"):
        Decoder(2, handshake=False).feed(h("92 03 01") + h("90"))


@pytest.mark.parametrize("version", [1, 2, 3])
def test_bad_frame_split_across_feeds(version: int) -> None:
    raw = {1: "02 00000001 5001", 2: "92 02 a1 31", 3: "93 02 01 05"}[version]
    good = encode_frame(version, Frame(3, 1, b"", 1 if version == 3 else None))
    dec = Decoder(version, handshake=False)
    assert len(dec.feed(good + h(raw)[:1])) == 1
    with pytest.raises(ProtocolError, match=f"mstream-v{version}"):
        dec.feed(h(raw)[1:])


def test_v3_wide_source_header_split_after_first_byte() -> None:
    # [2, 1, 1, bin(b"abc")] with code, id and source as uint64 and bin32: a 33-byte header,
    # valid msgpack that the decoder accepts when it arrives in one piece.
    u64 = "cf 0000000000000001"
    raw = h(f"94 cf 0000000000000002 {u64} {u64} c6 00000003") + b"abc"
    frame = Frame(2, 1, b"abc", 1)
    assert norm(Decoder(3, handshake=False).feed(raw + raw)) == [frame, frame]
    dec = Decoder(3, handshake=False)
    out = dec.feed(raw[:1])
    out += dec.feed(raw[1:] + raw)
    out += dec.feed(h("91 03"))
    assert norm(out) == [frame, frame, Frame(3)]


# -- properties ----------------------------------------------------------------------------

codes = st.integers(0, 255)
payloads = st.binary(max_size=MAX_PAYLOAD)
nonempty_payloads = st.binary(min_size=1, max_size=MAX_PAYLOAD)
ids64 = st.integers(0, 2**64 - 1)

# Frame is a NamedTuple: st.builds would also draw the fields left out (source), so
# build through lambdas that leave them at their defaults.
v1_frames = st.builds(lambda c, i, p: Frame(c, i, p), codes, st.integers(0, 2**31 - 1), payloads)
v2_frames = st.one_of(
    st.builds(lambda c: Frame(c), codes),
    st.builds(lambda c, i: Frame(c, i), codes, ids64),
    st.builds(lambda c, i, p: Frame(c, i, p), codes, ids64, nonempty_payloads),
)
v3_frames = st.one_of(
    st.builds(lambda c: Frame(c), codes),
    st.builds(lambda c, i, p, s: Frame(c, i, p, s), codes, ids64, payloads, st.sampled_from([-1, 0, 1])),
)
FRAMES = {1: v1_frames, 2: v2_frames, 3: v3_frames}


@pytest.mark.parametrize("version", [1, 2, 3])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_roundtrip(version: int, data: st.DataObject) -> None:
    frame = data.draw(FRAMES[version], label="frame")
    encoded = encode_frame(version, frame)
    assert norm(Decoder(version, handshake=False).feed(encoded)) == [frame]
    if version != 1:
        assert encoded == msgpack.packb(envelope(version, frame), use_bin_type=True)


@pytest.mark.parametrize("version", [1, 2, 3])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_roundtrip_sequences_with_split(version: int, data: st.DataObject) -> None:
    small = FRAMES[version].filter(lambda f: len(f.payload) <= 300)
    frames = data.draw(st.lists(small, min_size=1, max_size=8), label="frames")
    encoded = b"".join(encode_frame(version, f) for f in frames)
    cut = data.draw(st.integers(0, len(encoded)), label="cut")
    dec = Decoder(version, handshake=False)
    assert norm(dec.feed(encoded[:cut]) + dec.feed(encoded[cut:])) == frames


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("handshake", [False, True])
@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=48), max_size=6))
@example(chunks=[b"\xc1"])
@example(chunks=[bytes(40)])
def test_arbitrary_bytes_never_crash(version: int, handshake: bool, chunks: list[bytes]) -> None:
    for data in (chunks, [b"".join(chunks)]):
        dec = Decoder(version, handshake=handshake)
        try:
            for chunk in data:
                for item in dec.feed(chunk):
                    assert isinstance(item, Frame | Handshake)
        except ProtocolError as exc:
            assert exc.format == f"mstream-v{version}"


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("cid", [0, 1, 127, 128, 255, 256, 4097, 65535, 65536, 2**32])
@pytest.mark.parametrize("size", [1, 255, 256, MAX_PAYLOAD])
def test_content_frames_of_every_id_width(version: int, cid: int, size: int) -> None:
    """Content frames of channel ids in every msgpack width (fixint, uint8, uint16 take the
    decoder's inline path; wider ones the general parser) and bin8 / bin16 payloads decode
    the same, whole, after another frame, and byte by byte."""
    source = 1 if version == 3 else None
    frames = [Frame(2, 5, b"x", source), Frame(2, cid, bytes([cid % 251]) * size, source)]
    encoded = b"".join(msgpack.packb(envelope(version, f), use_bin_type=True) for f in frames)
    assert encoded == b"".join(encode_frame(version, f) for f in frames)
    assert norm(Decoder(version, handshake=False).feed(encoded)) == frames
    dec = Decoder(version, handshake=False)
    assert norm([item for i in range(len(encoded)) for item in dec.feed(encoded[i : i + 1])]) == frames
