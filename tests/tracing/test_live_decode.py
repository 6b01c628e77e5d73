"""The walk (``FrameDecoder.feed_parts`` and ``feed``: headers walked, data payloads
skipped) gives exactly the records of the codec alone (``codec_only=True``), whatever
parts and views the bytes come in: every format, real sessions, injected violations,
streams cut inside a frame, random bytes; and it never copies a data payload."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

import polymux
from polymux.tracing import FrameDecoder, FrameRecord, decode_chunks
from polymux.tracing.records import Chunk
from polymux.wire import mstream, yamux

from .conftest import record_session, stream
from .test_violations import CORRUPT, _rebuild, _valid_start


def _split(data: bytes, rng: random.Random, small: bool) -> list[bytes | memoryview]:
    """``data`` as views of random sizes (tiny ones near the start when ``small``)."""
    view = memoryview(data)
    parts: list[bytes | memoryview] = []
    pos = 0
    while pos < len(data):
        n = rng.randint(1, 13) if small and pos < 4096 else rng.choice((1, 7, 40, 1000, 30_000, 70_000))
        parts.append(view[pos : pos + n] if rng.random() < 0.8 else bytes(view[pos : pos + n]))
        pos += n
    return parts


def _live(
    fmt: str, chunks: list[Chunk], how: str, seed: int = 0, prefix: int | None = None
) -> tuple[list[FrameRecord], list[bytes | None]]:
    rng = random.Random(seed)
    decoder = FrameDecoder(fmt, session="s", payload_prefix=prefix)
    records: list[FrameRecord] = []
    for t, d, data in chunks:
        if how == "whole":
            parts: list[bytes | memoryview] = [data]
        else:
            parts = _split(data, rng, how == "small")
        records += decoder.feed_parts(t, d, parts)
    records += decoder.finish()
    return records, decoder.take_payloads() if prefix is not None else []


def _reference(
    fmt: str, chunks: list[Chunk], prefix: int | None = None
) -> tuple[list[FrameRecord], list[bytes | None]]:
    decoder = FrameDecoder(fmt, session="s", payload_prefix=prefix, codec_only=True)
    records: list[FrameRecord] = []
    for chunk in chunks:
        records += decoder.feed(chunk)
    records += decoder.finish()
    return records, decoder.take_payloads() if prefix is not None else []


def _captures(rec: object) -> Iterator[list[Chunk]]:
    yield rec.client.chunks  # type: ignore[attr-defined]
    yield rec.server.chunks  # type: ignore[attr-defined]


def _options(fmt: str) -> dict[str, object]:
    return {"streamux_length_bits": (6, 30, 12)} if fmt == "streamux" else {}


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_live_path_equals_the_file_path(fmt: str, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path, sizes=(1, 5_000, 70_001, 130_003), **_options(fmt))
    for chunks in _captures(rec):
        expected = _reference(fmt, chunks)[0]
        assert not [r for r in expected if r.frame_type in ("violation", "truncated")]
        for how in ("whole", "small", "views"):
            for seed in range(2 if how != "whole" else 1):
                assert _live(fmt, chunks, how, seed)[0] == expected, (how, seed)


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_decode_chunks_walks_and_equals_the_codec(fmt: str, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path, sizes=(1, 70_001), **_options(fmt))
    for chunks in _captures(rec):
        assert list(decode_chunks(fmt, chunks, session="s")) == _reference(fmt, chunks)[0]


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_payload_prefixes_are_the_same_on_both_paths(fmt: str, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path, sizes=(3, 70_001), **_options(fmt))
    chunks = rec.client.chunks
    records, payloads = _reference(fmt, chunks, prefix=5)
    assert len(payloads) == len(records)
    live, live_payloads = _live(fmt, chunks, "views", prefix=5)
    assert (live, live_payloads) == (records, payloads)
    # A data record carries the first bytes of its frame's payload.
    data = [(r, p) for r, p in zip(records, payloads, strict=True) if r.frame_type == "data"]
    assert data and all(p is not None and len(p) == min(5, r.length) for r, p in data)
    sent = stream(chunks, "c2s")
    assert any(p and p in sent for _r, p in data)


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_violations_and_cuts_match(fmt: str, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path, sizes=(2_000, 50_000), **_options(fmt))
    chunks = rec.client.chunks
    good = _reference(fmt, chunks)[0]
    offsets = sorted({r.offset for r in good if r.direction == "c2s"})
    corrupt, _message = CORRUPT[fmt]
    whole = stream(chunks, "c2s")
    for at in (offsets[1], offsets[len(offsets) // 2], offsets[-1]):
        variants = [
            _rebuild(chunks, "c2s", corrupt(whole, at)),
            _rebuild(chunks, "c2s", whole[: at + 3]),
            _rebuild(chunks, "c2s", whole[: at + 1]),
        ]
        for bad in variants:
            expected = _reference(fmt, bad)[0]
            for how in ("whole", "small", "views"):
                assert _live(fmt, bad, how, at)[0] == expected, (how, at)


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
def test_random_bytes_match(fmt: str) -> None:
    rng = random.Random(fmt)
    for trial in range(20):
        chunks: list[Chunk] = [
            (i, rng.choice(("c2s", "s2c")), rng.randbytes(rng.choice((1, 5, 64, 2000)))) for i in range(8)
        ]
        if trial % 2:
            chunks.insert(0, (0, "c2s", _valid_start(fmt)))
        expected = _reference(fmt, chunks)[0]
        for how in ("whole", "small"):
            assert _live(fmt, chunks, how, trial)[0] == expected


def test_non_minimal_encodings_go_to_the_codec() -> None:
    wide = b"\x93\xce\x00\x00\x00\x02\xce\x00\x00\x00\x01\xc6\x00\x00\x00\x03abc"
    offer = mstream.encode_frame(2, mstream.Frame(0, 1, mstream.encode_offer(2, "x", 100)))
    content = mstream.encode_frame(2, mstream.Frame(2, 1, b"hello"))
    accept = mstream.encode_frame(2, mstream.Frame(1, 1, mstream.encode_offer_accepted(2, 100)))
    chunks: list[Chunk] = [
        (1, "c2s", mstream.encode_handshake(2, bytes(16)) + offer),
        (2, "s2c", mstream.encode_handshake(2, b"\x02" * 16) + accept),
        (3, "c2s", wide + content + wide + content),
    ]
    expected = _reference("mstream-v2", chunks)[0]
    for how in ("whole", "small", "views"):
        for seed in range(5):
            assert _live("mstream-v2", chunks, how, seed)[0] == expected


class _NoCopy(bytes):
    """A payload that fails the test if anything makes a whole copy of it."""

    def __bytes__(self) -> bytes:
        raise AssertionError("the payload was copied")


def test_data_payloads_are_not_copied() -> None:
    """Payload views are walked, not read: a 64 MiB payload costs no copy (only the
    kept prefix is read)."""
    decoder = FrameDecoder("yamux", session="s", payload_prefix=4)
    decoder.feed_parts(0, "c2s", [yamux.encode_header(1, 1, 1, 0)])
    decoder.feed_parts(0, "s2c", [yamux.encode_header(1, 2, 1, 1 << 30)])
    big = memoryview(bytes(range(256)) * (1 << 18))  # 64 MiB
    records = []
    for i in range(0, len(big), 1 << 20):
        piece = big[i : i + (1 << 20)]
        records += decoder.feed_parts(1, "c2s", [yamux.encode_header(0, 0, 1, len(piece)), piece])
    assert [r.length for r in records] == [1 << 20] * 64
    assert decoder.take_payloads()[-1] == bytes(range(4))
