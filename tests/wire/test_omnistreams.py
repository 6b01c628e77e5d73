"""omnistreams codec: byte vectors for both numberings, the length prefix, bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from polymux.exceptions import ProtocolError
from polymux.wire.omnistreams import (
    LEGACY,
    MAX_MESSAGE_SIZE,
    SPEC,
    Kind,
    LengthPrefixDecoder,
    Message,
    decode,
    encode,
    encode_length,
)


# (kind, stream id, payload, spec bytes, legacy bytes or None when legacy has no such message)
VECTORS = [
    (Kind.CONTROL, None, b"hi", b"\x00hi", b"\x05hi"),
    (Kind.CREATE, 7, b'{"name":"a"}', b'\x01\x07{"name":"a"}', b'\x00\x07{"name":"a"}'),
    (Kind.DATA, 255, b"\x01\x02", b"\x02\xff\x01\x02", b"\x01\xff\x01\x02"),
    (Kind.DATA, 0, b"", b"\x02\x00", b"\x01\x00"),
    (Kind.END, 3, b"", b"\x03\x03", b"\x02\x03"),
    (Kind.CANCEL_RECEIVE, 4, b"", b"\x04\x04", None),
    (Kind.REQUEST_DATA, 9, b"\xff", b"\x05\x09\xff", b"\x04\x09\xff"),
    (Kind.CANCEL_SEND, 1, b"", b"\x06\x01", b"\x03\x01"),
]


@pytest.mark.parametrize(("kind", "sid", "payload", "spec", "legacy"), VECTORS)
def test_vectors_both_numberings(
    kind: Kind, sid: int | None, payload: bytes, spec: bytes, legacy: bytes | None
) -> None:
    assert encode(kind, sid, payload, SPEC) == spec
    assert decode(spec, SPEC) == Message(kind, sid, payload)
    if legacy is None:
        with pytest.raises(ValueError, match="legacy numbering has no CANCEL_RECEIVE_STREAM"):
            encode(kind, sid, payload, LEGACY)
    else:
        assert encode(kind, sid, payload, LEGACY) == legacy
        assert decode(legacy, LEGACY) == Message(kind, sid, payload)


def test_numberings_differ_on_the_same_bytes() -> None:
    # 0x00 0x05 is CONTROL "\x05" in the spec numbering and CREATE of stream 5 in the legacy one.
    assert decode(b"\x00\x05", SPEC) == Message(Kind.CONTROL, None, b"\x05")
    assert decode(b"\x00\x05", LEGACY) == Message(Kind.CREATE, 5, b"")


def test_payload_is_a_view() -> None:
    data = b"\x02\x01" + b"x" * 1000
    message = decode(data, SPEC)
    assert isinstance(message.payload, memoryview)
    assert message.payload.obj is data


@pytest.mark.parametrize(
    ("data", "numbering", "match"),
    [
        (b"", SPEC, "empty message"),
        (b"\x07\x01", SPEC, "unknown message type 7"),
        (b"\x06\x01", LEGACY, "unknown message type 6"),
        (b"\xff", SPEC, "unknown message type 255"),
        (b"\x02", SPEC, "STREAM_DATA message of 1 byte has no stream id byte"),
        (b"\x01", LEGACY, "STREAM_DATA message of 1 byte has no stream id byte"),
        (b"\x05\x01", SPEC, "STREAM_REQUEST_DATA for stream 1 has 0 count bytes"),
        (b"\x05\x01\x01\x01", SPEC, "has 2 count bytes"),
        (b"\x03\x01x", SPEC, "STREAM_END for stream 1 carries 1 unexpected bytes"),
        (b"\x06\x02yy", SPEC, "CANCEL_SEND_STREAM for stream 2 carries 2"),
    ],
)
def test_bad_messages(data: bytes, numbering: object, match: str) -> None:
    with pytest.raises(ProtocolError, match=match) as info:
        decode(data, numbering)  # type: ignore[arg-type]
    assert info.value.format == "omnistreams"


def test_encode_rejects_bad_fields() -> None:
    with pytest.raises(ValueError, match="stream id must be in 0..255, got 256"):
        encode(Kind.DATA, 256, b"")
    with pytest.raises(ValueError, match="stream id must be in 0..255, got None"):
        encode(Kind.END, None)
    with pytest.raises(ValueError, match="CONTROL message has no stream id"):
        encode(Kind.CONTROL, 1)
    with pytest.raises(ValueError, match="exactly one byte"):
        encode(Kind.REQUEST_DATA, 1, b"\x01\x02")
    with pytest.raises(ValueError, match="message length must be in 1..2\\*\\*32-1, got 0"):
        encode_length(0)


def test_length_prefix_vector() -> None:
    message = encode(Kind.DATA, 1, b"abc")
    framed = encode_length(len(message)) + message
    assert framed == b"\x00\x00\x00\x05\x02\x01abc"
    assert [bytes(m) for m in LengthPrefixDecoder().feed(framed)] == [message]


def test_length_prefix_split_anywhere() -> None:
    messages = [encode(Kind.DATA, i % 256, bytes([i % 256]) * i) for i in range(1, 60)]
    stream = b"".join(encode_length(len(m)) + m for m in messages)
    for step in (1, 3, 7, 64, 1000):
        decoder = LengthPrefixDecoder()
        out: list[bytes] = []
        for off in range(0, len(stream), step):
            out += [bytes(m) for m in decoder.feed(stream[off : off + step])]
        assert out == messages
        assert decoder.pending == 0


@given(st.lists(st.binary(min_size=1, max_size=300), max_size=20), st.integers(1, 50))
def test_length_prefix_roundtrip(messages: list[bytes], step: int) -> None:
    stream = b"".join(encode_length(len(m)) + m for m in messages)
    decoder = LengthPrefixDecoder()
    out: list[bytes] = []
    for off in range(0, len(stream), step):
        out += [bytes(m) for m in decoder.feed(stream[off : off + step])]
    assert out == messages


@pytest.mark.parametrize("max_size", [0, -1])
def test_length_prefix_decoder_needs_a_positive_max_size(max_size: int) -> None:
    with pytest.raises(ValueError, match=f"max_size must be positive, got {max_size}"):
        LengthPrefixDecoder(max_size)


def test_numbering_repr_names_it() -> None:
    assert repr(SPEC) == "<omnistreams numbering 'spec'>"
    assert repr(LEGACY) == "<omnistreams numbering 'legacy'>"


def test_length_prefix_zero_and_too_large() -> None:
    with pytest.raises(ProtocolError, match="length prefix 0"):
        LengthPrefixDecoder().feed(b"\x00\x00\x00\x00")
    with pytest.raises(ProtocolError, match="length prefix 101 > max_message_size 100"):
        LengthPrefixDecoder(100).feed(b"\x00\x00\x00\x65")
    # Too large is caught from the prefix alone, before any body is buffered.
    decoder = LengthPrefixDecoder()
    with pytest.raises(ProtocolError, match=f"> max_message_size {MAX_MESSAGE_SIZE}"):
        decoder.feed(b"\xff\xff")
        decoder.feed(b"\xff\xff")
    # ... also when the prefix arrives in two pieces after a complete message.
    decoder = LengthPrefixDecoder(10)
    assert decoder.feed(b"\x00\x00\x00\x01\x00\x00\x00") == [b"\x00"]
    with pytest.raises(ProtocolError, match="length prefix 255"):
        decoder.feed(b"\x00\xff")
