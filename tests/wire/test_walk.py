"""Where whole frames end, read from their headers alone (``Decoder.whole_frames``, over
``FrameBuffer.walk``): how input slicing cuts a read at frame ends. Byte vectors of every
format's decoder: whole frames up to ``most``, a frame or a header that runs past the read,
the rest of a held frame first, a header the format refuses, and the states where a decoder
cannot tell (a held header, MultiplexingStream's handshake), with Streamux's streamed bodies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from polymux.wire import mplex, mstream, omnistreams, smux, streamux, yamux


def _mplex(n: int) -> bytes:
    return mplex.encode_frame(mplex.Frame(3, mplex.Flag.MESSAGE_INITIATOR, bytes(n)))


def _yamux(n: int) -> bytes:
    return yamux.encode_frame(yamux.Frame(yamux.Type.DATA, 0, 1, n, bytes(n)))


def _smux(n: int) -> bytes:
    return smux.encode_frame(1, smux.Frame(smux.Cmd.PSH, 1, bytes(n)))


def _omni(n: int) -> bytes:
    body = omnistreams.encode(omnistreams.Kind.DATA, 1, bytes(n))
    return omnistreams.encode_length(len(body)) + body


def _mstream(n: int) -> bytes:
    return mstream.encode_frame(3, mstream.Frame(mstream.ControlCode.CONTENT, 1, bytes(n), 0))


NEGOTIATED = streamux.Negotiated(12, 17)


def _streamux(n: int) -> bytes:
    return streamux.encode_header(NEGOTIATED, 1, n, False, False) + bytes(n)


FORMATS: dict[str, tuple[Callable[[], Any], Callable[[int], bytes], bytes]] = {
    # name: (a decoder, one frame of n body bytes, a header the format refuses)
    "mplex": (mplex.Decoder, _mplex, b"\x0f\x00"),  # flag 7
    "yamux": (lambda: yamux.Decoder(1 << 20), _yamux, b"\x07" + bytes(11)),  # version 7
    "smux": (lambda: smux.Decoder(1), _smux, b"\x02" + bytes(7)),  # version 2 on a v1 session
    "omnistreams": (omnistreams.LengthPrefixDecoder, _omni, bytes(4)),  # length 0
    "mstream-v3": (lambda: mstream.Decoder(3), _mstream, b"\x95" + bytes(7)),  # 5 elements
    "streamux": (
        lambda: streamux.Decoder(NEGOTIATED),
        _streamux,
        b"\xff\xff\xff\xff",
    ),  # the bit past the widths
}


@pytest.mark.parametrize("name", FORMATS)
def test_whole_frames_end_where_their_headers_say(name: str) -> None:
    make, frame, _bad = FORMATS[name]
    sizes = [10, 3000, 1, 20_000, 7]
    frames = [frame(n) for n in sizes]
    data = b"".join(frames)
    ends = [sum(map(len, frames[: i + 1])) for i in range(len(frames))]
    decoder = make()
    for most in range(1, len(frames)):
        assert decoder.whole_frames(data, 0, most) == ends[most - 1]
    assert decoder.whole_frames(data, ends[0], 2) == ends[2]  # from a frame's start
    assert decoder.whole_frames(data, 0, 0) == 0
    assert decoder.whole_frames(data, len(data), 3) == len(data)  # nothing left
    # A frame that runs past the read ends the walk at the read's end: all there is of it.
    assert decoder.whole_frames(data[: ends[3] - 5], 0, 8) == ends[3] - 5
    # So does a header cut by the read's end.
    assert decoder.whole_frames(data[: ends[0] + 1], 0, 8) == ends[0] + 1
    # Nothing was decoded or held by walking.
    assert decoder.pending == 0
    assert len(decoder.feed(data)) == len(frames)


@pytest.mark.parametrize("name", FORMATS)
def test_a_refused_header_ends_the_walk_where_its_frame_starts(name: str) -> None:
    make, frame, bad = FORMATS[name]
    data = frame(5) + frame(6) + bad + bytes(16)
    assert make().whole_frames(data, 0, 8) == len(frame(5)) + len(frame(6))


@pytest.mark.parametrize("name", FORMATS)
def test_the_rest_of_a_held_frame_comes_first(name: str) -> None:
    make, frame, _bad = FORMATS[name]
    first, second, third = frame(20_000), frame(100), frame(200)
    decoder = make()
    assert decoder.feed(first[:1000]) == []  # its header is in: its size is known
    rest = first[1000:] + second + third
    assert decoder.whole_frames(rest, 0, 2) == len(first) - 1000 + len(second)
    assert decoder.whole_frames(rest, 0, 1) == len(first) - 1000
    assert decoder.whole_frames(first[1000:2000], 0, 4) == 1000  # the read ends inside it


@pytest.mark.parametrize("name", FORMATS)
def test_a_held_header_cannot_tell(name: str) -> None:
    make, frame, _bad = FORMATS[name]
    decoder = make()
    whole = frame(100)
    decoder.feed(whole[:1])  # a header's first byte: the frame's size is not known
    assert decoder.whole_frames(whole[1:] + frame(5), 0, 4) == 0


def test_multiplexing_stream_handshake_is_not_a_frame() -> None:
    decoder = mstream.Decoder(2)
    data = mstream.encode_handshake(2, bytes(16)) + mstream.encode_frame(2, mstream.Frame(3, 1, bytes(9)))
    assert decoder.whole_frames(data, 0, 4) == 0
    decoder.feed(data)
    frame = mstream.encode_frame(2, mstream.Frame(3, 1, bytes(50)))
    assert decoder.whole_frames(frame * 2, 0, 4) == 2 * len(frame)


def test_streamux_streamed_body_comes_first() -> None:
    decoder = streamux.Decoder(NEGOTIATED, stream_bodies=True)
    big = _streamux(30_000)
    decoder.feed(big[:1000])  # a body being streamed: 29,002 bytes of it to come
    left = len(big) - 1000
    after = _streamux(10) + _streamux(20)
    assert decoder.whole_frames(big[1000:] + after, 0, 2) == left + len(_streamux(10))
    assert decoder.whole_frames(big[1000:5000], 0, 2) == 4000  # the read ends in the body
    assert decoder.whole_frames(big[1000:] + after, 0, 1) == left
