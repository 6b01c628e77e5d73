"""Regression tests for what the fuzzers found (see fuzz/README.md, "Findings")."""

from __future__ import annotations

import base64
import gc
import tracemalloc

import polymux_fuzz as pf
import pytest

import polymux
from polymux.wire import _varint, mplex, mstream


def _chain(exc: BaseException) -> int:
    n, tb = 0, exc.__traceback__
    while tb is not None:
        n, tb = n + 1, tb.tb_next
    return n


def test_shared_incomplete_markers_keep_no_traceback() -> None:
    """Finding 1 (atheris, mstream-v1: RSS grew ~5 MB per 1,000 runs). The decoders raise a
    shared "need more bytes" instance on every frame split across reads; each raise
    appended to its ``__traceback__``, so the chain (and every frame and buffer it
    references) grew for the life of the process. Now the handlers drop it."""
    for _ in range(50):
        dec = mstream.Decoder(2, handshake=False)
        dec.feed(b"\x93\x02")  # a frame header cut short
        dec.feed(b"\x01")
        mdec = mplex.Decoder()
        mdec.feed(b"\x80")  # a varint cut short
        mdec.feed(b"\x80")
    assert _chain(mstream._INCOMPLETE) == 0
    assert _chain(_varint._INCOMPLETE) == 0


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
def test_engine_runs_leave_nothing_behind(fmt: str) -> None:
    """Memory after many runs that end inside a frame (the common case on TCP) is flat."""
    seeds = [s for s in pf.corpus_inputs(fmt) if len(s) > 64]
    inputs = [s[: len(s) // 2 + k] for s in seeds for k in range(3)]

    def burst(n: int) -> None:
        for _ in range(n):
            for data in inputs:
                pf.drive_engine(fmt, data)

    burst(2)  # warm-up: imports, interned names, caches of fixed size
    gc.collect()
    tracemalloc.start()
    try:
        burst(5)
        gc.collect()
        first = tracemalloc.get_traced_memory()[0]
        burst(15)
        gc.collect()
        second = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert second - first < 32 * 1024, f"{fmt}: {second - first} bytes kept by 15 more bursts"


def test_peer_leaving_fewer_ids_than_we_open() -> None:
    """atheris, streamux (harness finding): a peer that negotiates 1-bit request ids
    leaves 2 ids; opening a third is the documented local limit (``RuntimeError`` from the
    engine, ``LimitExceeded`` from the session), not a crash of the harness."""
    data = base64.b64decode("BQER0Gs25w==")
    pf.drive_engine("streamux", data)


def test_harness_counts_its_own_sends_apart() -> None:
    """hypothesis, yamux (harness finding): fed one byte at a time with three channels of
    its own open, the harness sends 16 bytes on each of them per piece (3 x 28 bytes per
    input byte), which broke the 64-bytes-per-input-byte bound meant for the engine's own
    replies. The two are bounded apart now; the engine's replies stay within the bound."""
    from polymux.wire.yamux import Type, encode_header

    body = 4000
    data = bytes([pf.control_byte(is_client=False, opens=3, chunk=1)])
    data += encode_header(Type.DATA, 0, 1, body) + b"x" * body  # a stream nobody opened: dropped
    outcome = pf.drive_engine("yamux", data)
    assert outcome.error is None
    assert outcome.sent <= pf._OUT_PER_BYTE * (len(data) - 1) + pf._OUT_CONST
