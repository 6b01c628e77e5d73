"""Format detection from the first bytes of each direction."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import polymux
from polymux.tracing import detect_format

from .conftest import record_session


def _heads(chunks: list[tuple[int, str, bytes]], size: int) -> tuple[bytes, bytes]:
    heads = {"c2s": b"", "s2c": b""}
    for _t, d, data in chunks:
        heads[d] = (heads[d] + data)[:size]
    return heads["c2s"], heads["s2c"]


def _expected(fmt: str) -> str:
    return "mplex" if fmt == "multiplex" else fmt  # the same wire format


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_detects_every_format(fmt: str, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path, sizes=(100, 70_000))
    for size in (64, 256, 100_000):
        c2s, s2c = _heads(rec.client.chunks, size)
        assert detect_format(c2s, s2c) == _expected(fmt), size
        # The client's bytes alone are enough.
        assert detect_format(c2s, b"") == _expected(fmt), size


def test_nothing_to_go_on() -> None:
    assert detect_format(b"", b"") is None
    assert detect_format(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 OK\r\n") is None
    assert detect_format(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"") is None  # TLS ClientHello
    rng = random.Random(5)
    hits = sum(detect_format(rng.randbytes(64), rng.randbytes(64)) is not None for _ in range(200))
    assert hits <= 10  # random bytes are rarely taken for anything
