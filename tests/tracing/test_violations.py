"""Bad input: a violation injected into a real capture is reported at the offset of the
bad frame, with the codec's message, and decoding of that direction stops; a stream cut
inside a frame gives ``truncated``; legal but non-minimal encodings keep offsets exact;
random bytes and absurd lengths never raise and never buffer without bound."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import polymux
from polymux.tracing import FrameDecoder, decode_chunks
from polymux.wire import mplex, mstream, yamux

from .conftest import record_session, stream


def _rebuild(
    chunks: list[tuple[int, str, bytes]], direction: str, new: bytes
) -> list[tuple[int, str, bytes]]:
    """The same chunking, with ``direction``'s bytes replaced by ``new`` (cut short if
    ``new`` is shorter)."""
    out = []
    pos = 0
    for t, d, data in chunks:
        if d != direction:
            out.append((t, d, data))
            continue
        piece = new[pos : pos + len(data)]
        pos += len(data)
        if piece:
            out.append((t, d, piece))
    return out


def _set(data: bytes, at: int, patch: bytes) -> bytes:
    return data[:at] + patch + data[at + len(patch) :]


# How to break the frame that starts at ``at`` so that the codec rejects its header.
CORRUPT: dict[str, tuple[Callable[[bytes, int], bytes], str]] = {
    "yamux": (lambda b, at: _set(b, at, b"\x07"), "yamux: frame header version is 7, expected 0"),
    "mstream-v1": (
        lambda b, at: _set(b, at + 5, b"\xff\xff"),
        "mstream-v1: frame payload length 65535 exceeds the 20480-byte maximum",
    ),
    "mstream-v2": (
        lambda b, at: _set(b, at, b"\xc1"),
        "mstream-v2: frame must be a msgpack array, got type byte 0xc1",
    ),
    "mstream-v3": (
        lambda b, at: _set(b, at, b"\xc1"),
        "mstream-v3: frame must be a msgpack array, got type byte 0xc1",
    ),
    "mplex": (lambda b, at: _set(b, at, b"\x0f"), "mplex: frame header has unknown flag 7 (stream id 1)"),
    "multiplex": (
        lambda b, at: _set(b, at, b"\x0f"),
        "multiplex: frame header has unknown flag 7 (stream id 1)",
    ),
    "streamux": (
        lambda b, at: _set(b, at + 3, bytes([b[at + 3] | 0xF0])),
        "streamux: chunk header 0x",
    ),
    "omnistreams": (
        lambda b, at: _set(b, at, bytes(4)),
        "omnistreams: length prefix 0 (a message needs a type byte)",
    ),
    "omnistreams-legacy": (
        lambda b, at: _set(b, at, bytes(4)),
        "omnistreams: length prefix 0 (a message needs a type byte)",
    ),
    "smux": (lambda b, at: _set(b, at, b"\x07"), "smux: frame header version is 7, expected 1"),
    "smux-v2": (lambda b, at: _set(b, at, b"\x07"), "smux-v2: frame header version is 7, expected 2"),
}


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_injected_violation_is_reported_at_its_offset(fmt: str, tmp_path: Path) -> None:
    options = {"streamux_length_bits": (6, 30, 12)} if fmt == "streamux" else {}
    rec = await record_session(fmt, tmp_path, sizes=(2_000, 50_000), **options)
    chunks = rec.client.chunks
    good = list(decode_chunks(fmt, chunks, session="s"))
    c2s_offsets = sorted({r.offset for r in good if r.direction == "c2s"})
    at = c2s_offsets[len(c2s_offsets) // 2]  # a frame in the middle of the stream
    corrupt, message = CORRUPT[fmt]
    bad_chunks = _rebuild(chunks, "c2s", corrupt(stream(chunks, "c2s"), at))
    records = list(decode_chunks(fmt, bad_chunks, session="s"))
    c2s = [r for r in records if r.direction == "c2s"]
    assert c2s[-1].frame_type == "violation"
    assert c2s[-1].offset == at
    assert (c2s[-1].error or "").startswith(message), c2s[-1].error
    # Everything before the bad frame decodes as before; nothing after it.
    before = [r for r in good if r.direction == "c2s" and r.offset < at]
    assert c2s[:-1] == before
    assert sum(r.frame_type == "violation" for r in records) <= 2


@pytest.mark.parametrize("fmt", ["yamux", "mstream-v3", "mplex", "streamux"])
async def test_stream_cut_inside_a_frame_is_truncated(fmt: str, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path, sizes=(200_000,))
    chunks = rec.client.chunks
    good = list(decode_chunks(fmt, chunks, session="s"))
    data_frames = [r for r in good if r.direction == "c2s" and r.frame_type == "data"]
    at = data_frames[1].offset
    cut = stream(chunks, "c2s")[: at + 3]
    records = list(decode_chunks(fmt, _rebuild(chunks, "c2s", cut), session="s"))
    c2s = [r for r in records if r.direction == "c2s"]
    assert c2s[-1].frame_type == "truncated"
    assert (c2s[-1].offset, c2s[-1].length) == (at, 3)
    assert (
        c2s[-1].error
        == f"{fmt}: the c2s stream ends inside a {'chunk' if fmt == 'streamux' else 'frame'} (3 bytes at offset {at})"
    )
    assert c2s[:-1] == [r for r in good if r.direction == "c2s" and r.offset < at]


def test_non_minimal_encodings_keep_offsets_exact() -> None:
    # mstream-v2: [2, 1, bin] with a uint32 code, a uint32 id and a bin32 length.
    wide = b"\x93\xce\x00\x00\x00\x02\xce\x00\x00\x00\x01\xc6\x00\x00\x00\x03abc"
    v2 = mstream.encode_handshake(2, bytes(16))
    offer = mstream.encode_frame(2, mstream.Frame(0, 1, mstream.encode_offer(2, "x", 100)))
    content = mstream.encode_frame(2, mstream.Frame(2, 1, b"hello"))
    accept = mstream.encode_frame(2, mstream.Frame(1, 1, mstream.encode_offer_accepted(2, 100)))
    chunks = [
        (1, "c2s", v2 + offer),
        (2, "s2c", mstream.encode_handshake(2, b"\x02" * 16) + accept),
        (3, "c2s", wide + content + wide),
    ]
    records = [r for r in decode_chunks("mstream-v2", chunks, session="s") if r.direction == "c2s"]
    base = 22 + len(offer)
    assert [(r.frame_type, r.offset, r.length) for r in records[2:]] == [
        ("data", base, 3),
        ("data", base + len(wide), 5),
        ("data", base + len(wide) + len(content), 3),
    ]
    # mplex: a two-byte header varint for id 1 / NEW_STREAM (0x88 0x00 = 8).
    frames = b"\x88\x00\x01n" + mplex.encode_frame(mplex.Frame(1, 2, b"abc")) + b"\x8a\x80\x00\x02hi"
    records = list(decode_chunks("mplex", [(1, "c2s", frames)], session="s"))
    assert [(r.channel, r.frame_type, r.offset, r.length) for r in records] == [
        ("c1", "open", 0, 1),
        ("c1", "data", 4, 3),
        ("c1", "data", 9, 2),
    ]


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
def test_random_bytes_never_raise(fmt: str) -> None:
    rng = random.Random(fmt)
    for trial in range(20):
        chunks = []
        for i in range(10):
            size = rng.choice((1, 5, 64, 2000))
            chunks.append((i, rng.choice(("c2s", "s2c")), rng.randbytes(size)))
        if trial % 2:  # a plausible start, then noise
            chunks.insert(0, (0, "c2s", _valid_start(fmt)))
        records = list(decode_chunks(fmt, chunks, session="r"))
        for direction in ("c2s", "s2c"):
            ends = [
                r for r in records if r.direction == direction and r.frame_type in ("violation", "truncated")
            ]
            assert len(ends) <= 1
            if ends:
                assert ends[0] is [r for r in records if r.direction == direction][-1]
                assert ends[0].error and ends[0].error.startswith(fmt.split("-legacy")[0])


def _valid_start(fmt: str) -> bytes:
    if fmt == "yamux":
        return yamux.encode_header(1, 1, 1, 0)
    if fmt.startswith("mstream-v") and fmt != "mstream-v3":
        return mstream.encode_handshake(int(fmt[-1]), bytes(16))
    if fmt in ("mplex", "multiplex"):
        return mplex.encode_frame(mplex.Frame(0, 0, b""))
    return b""


def test_absurd_lengths_are_refused_at_once() -> None:
    """A header announcing a huge frame is a violation when the header arrives: nothing
    waits for (or buffers) gigabytes."""
    cases = {
        "yamux": yamux.encode_header(0, 0, 1, 0xFFFFFFFF),
        "mplex": b"\x0a" + b"\xff\xff\xff\xff\x7f",
        "mstream-v1": mstream.encode_handshake(1, bytes(16)) + b"\x02\x00\x00\x00\x01\xff\xff",
        "omnistreams": b"\xff\xff\xff\xff",
    }
    for fmt, head in cases.items():
        decoder = FrameDecoder(fmt, session="x")
        records = decoder.feed((0, "c2s", head))
        assert records and records[-1].frame_type == "violation", fmt
        assert decoder.feed((1, "c2s", bytes(1 << 20))) == []  # ignored after the violation
        assert decoder.finish() == []


@pytest.mark.parametrize("fmt", ["yamux", "mstream-v3", "mplex"])
def test_decoding_is_fast_enough(fmt: str) -> None:
    """Bulk data decodes at well over 30 MB/s (frames are sized by formula, not replayed;
    typically ~1 GB/s)."""
    if fmt == "yamux":
        head = [
            (0, "c2s", yamux.encode_header(1, 1, 1, 0)),
            (0, "s2c", yamux.encode_header(1, 2, 1, 1 << 30)),
        ]
        frame = yamux.encode_header(0, 0, 1, 65536) + bytes(65536)
    elif fmt == "mstream-v3":
        offer = mstream.Frame(0, 1, mstream.encode_offer(3, "x", 1 << 40), 1)
        accept = mstream.Frame(1, 1, mstream.encode_offer_accepted(3, 1 << 40), -1)
        head = [(0, "c2s", mstream.encode_frame(3, offer)), (0, "s2c", mstream.encode_frame(3, accept))]
        frame = mstream.encode_frame(3, mstream.Frame(2, 1, bytes(20480), 1))
    else:
        head = [(0, "c2s", mplex.encode_frame(mplex.Frame(0, 0, b"x")))]
        frame = mplex.encode_frame(mplex.Frame(0, 2, bytes(65536)))
    body = frame * (256 * 1024 // len(frame))
    chunks = head + [(i, "c2s", body) for i in range(128)]
    start = time.perf_counter()
    records = list(decode_chunks(fmt, chunks, session="b"))
    elapsed = time.perf_counter() - start
    assert not [r for r in records if r.frame_type in ("violation", "truncated")]
    payload = 20480 if fmt == "mstream-v3" else 65536
    assert (
        sum(r.length for r in records if r.frame_type == "data") == 128 * (len(body) // len(frame)) * payload
    )
    assert elapsed < 1.0, elapsed


def test_violation_deep_inside_a_big_chunk_is_found_fast() -> None:
    """The bad frame is located by bisection at the codec's speed, not byte by byte."""
    frame = yamux.encode_header(0, 0, 1, 1000) + bytes(1000)
    good = frame * 8000  # 8 MB of valid frames, then a bad header, all in one chunk
    chunks = [
        (0, "s2c", yamux.encode_header(1, 2, 1, 1 << 30)),
        (1, "c2s", yamux.encode_header(1, 1, 1, 0) + good + b"\x05" + bytes(11) + frame),
    ]
    start = time.perf_counter()
    records = list(decode_chunks("yamux", chunks, session="v"))
    elapsed = time.perf_counter() - start
    c2s = [r for r in records if r.direction == "c2s"]
    assert [r.frame_type for r in c2s[1:-1]] == ["data"] * 8000
    assert c2s[-1].frame_type == "violation"
    assert c2s[-1].offset == 12 + len(good)
    assert c2s[-1].error == "yamux: frame header version is 5, expected 0"
    assert elapsed < 2.0, elapsed


def test_streamux_bytes_without_negotiation_are_bounded() -> None:
    from polymux.wire import streamux

    init = streamux.encode_init(streamux.InitMessage())
    decoder = FrameDecoder("streamux", session="x")
    records = decoder.feed((0, "c2s", init))
    assert [r.frame_type for r in records] == ["handshake"]
    start = time.perf_counter()
    for i in range(20):  # the server never answers: 20 MiB wait for negotiation
        records += decoder.feed((i, "c2s", bytes(1 << 20)))
    records += decoder.finish()
    assert time.perf_counter() - start < 2.0
    assert [r.frame_type for r in records] == ["handshake", "violation"]
    assert records[1].offset == 5
    assert records[1].error == (
        "streamux: more than 16777216 bytes of chunks arrived before negotiation "
        "(no initialize message from the other side)"
    )
