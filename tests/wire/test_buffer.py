"""The split-frame buffer every decoder shares (``polymux.wire._buffer.FrameBuffer``): a frame
larger than ``LARGE_FRAME`` that spans several reads is kept as the pieces the reads brought
(views of them, not copies) and joined once when whole; small pieces are copied (a view
would pin a whole read for a few bytes); whatever the cuts, the frames come out the same."""

from __future__ import annotations

import pytest

from polymux.wire import mplex, smux, yamux
from polymux.wire._buffer import LARGE_FRAME, FrameBuffer


KiB = 1024
BIG = 1024 * KiB  # > LARGE_FRAME


def _yamux_frames() -> bytes:
    big = yamux.encode_frame(yamux.Frame(yamux.Type.DATA, 0, 1, BIG, bytes(range(256)) * (BIG // 256)))
    small = yamux.encode_frame(yamux.Frame(yamux.Type.DATA, 0, 3, 5, b"hello"))
    return big + small + big


def _cut(data: bytes, sizes: list[int]) -> list[bytes]:
    out, pos, i = [], 0, 0
    while pos < len(data):
        n = sizes[i % len(sizes)]
        out.append(data[pos : pos + n])
        pos += n
        i += 1
    return out


def _decode(reads: list[bytes]) -> list[tuple[int, int, bytes]]:
    decoder = yamux.Decoder(2 * BIG)
    frames = []
    for read in reads:
        frames += [(frame.stream_id, frame.length, bytes(frame.body)) for frame in decoder.feed(read)]
    assert decoder.pending == 0
    return frames


@pytest.mark.parametrize(
    "sizes",
    [[256 * KiB], [64 * KiB], [1, 11, 256 * KiB], [5, 300 * KiB, 3], [BIG + 29], [7 * KiB, 256 * KiB, 1]],
    ids=["256k", "64k", "header-dribbled", "odd", "whole", "mixed"],
)
def test_large_frames_come_out_whole_however_the_reads_cut_them(sizes: list[int]) -> None:
    data = _yamux_frames()
    expected = _decode([data])
    assert [(sid, n) for sid, n, _ in expected] == [(1, BIG), (3, 5), (1, BIG)]
    assert _decode(_cut(data, sizes)) == expected


def test_a_large_frame_keeps_its_reads_and_copies_only_small_pieces() -> None:
    buffer = FrameBuffer(12)
    frame = bytes(12) + bytes(range(256)) * (BIG // 256)
    first = bytes(100 * KiB) + frame[: 100 * KiB]  # a read that ends with the frame's start
    buffer.hold(memoryview(first)[100 * KiB :], need=len(frame))  # the rest of a read: a view
    assert buffer.held == frame[:12]  # the header, where head() reads it
    (piece,) = buffer._pieces
    assert isinstance(piece, memoryview) and piece.obj is first  # kept, not copied
    whole, pos = buffer.resume(frame[100 * KiB : 356 * KiB], lambda head: len(frame))
    assert whole is None and pos == 256 * KiB
    assert buffer._pieces[-1].__class__ is bytes  # the whole read, as it is
    tiny = frame[356 * KiB : 356 * KiB + 10] + bytes(1000)  # a read mostly of something else
    whole, pos = buffer.resume(memoryview(tiny)[:10], lambda head: len(frame))
    assert whole is None and pos == 10
    assert buffer._pieces[-1].__class__ is bytes and len(buffer._pieces[-1]) == 10  # copied
    assert buffer.pending == 356 * KiB + 10
    rest = frame[356 * KiB + 10 :]
    whole, pos = buffer.resume(rest + b"next", lambda head: len(frame))
    assert whole == frame and pos == len(rest)
    assert buffer.pending == 0 and not buffer.held and not buffer._pieces


def test_the_header_of_a_large_frame_goes_first_when_it_came_in_pieces() -> None:
    """The start of a frame held before its size is known (a header cut short), then the
    rest of a large frame: the header bytes are completed where head() reads them."""
    buffer = FrameBuffer(12)
    frame = bytes(12) + bytes(BIG)
    whole, _ = buffer.resume(frame[:5], lambda head: len(frame) if len(head) >= 12 else _incomplete())
    assert whole is None
    whole, _ = buffer.resume(frame[5 : 300 * KiB], lambda head: len(frame))
    assert whole is None and buffer.held == frame[:12]
    assert buffer.head(12) == frame[:12]
    whole, _ = buffer.resume(frame[300 * KiB :], lambda head: len(frame))
    assert whole == frame


def test_take_returns_the_pieces_joined() -> None:
    buffer = FrameBuffer(12)
    frame = bytes(12) + bytes(range(256)) * (BIG // 256)
    buffer.hold(frame[: 300 * KiB], need=len(frame))
    assert buffer.take() == frame[: 300 * KiB]
    assert buffer.pending == 0
    buffer.hold(b"abc")  # a small start: one buffer
    assert buffer.take() == b"abc"


def test_walk_counts_what_a_large_held_frame_still_needs() -> None:
    """Slicing's walk starts after the rest of the held frame, however it is held."""
    decoder = mplex.Decoder()
    frame = mplex.encode_frame(mplex.Frame(3, mplex.Flag.MESSAGE_INITIATOR, bytes(BIG)))
    nxt = mplex.encode_frame(mplex.Frame(3, mplex.Flag.MESSAGE_INITIATOR, b"x"))
    decoder.feed(frame[: 300 * KiB])
    rest = frame[300 * KiB :] + nxt
    assert decoder.whole_frames(rest, 0, 1) == len(frame) - 300 * KiB
    assert decoder.whole_frames(rest, 0, 2) == len(rest)
    assert LARGE_FRAME < BIG


def test_a_smux_frame_below_the_large_size_grows_in_one_buffer() -> None:
    decoder = smux.Decoder(1)
    frame = smux.encode_frame(1, smux.Frame(smux.Cmd.PSH, 1, bytes(60 * KiB)))
    assert decoder.feed(frame[:1000]) == []
    assert decoder._buffer._pieces == []
    (got,) = decoder.feed(frame[1000:])
    assert bytes(got.body) == bytes(60 * KiB)


def _incomplete() -> int:
    from polymux.wire._buffer import INCOMPLETE

    raise INCOMPLETE
