"""Property-based fuzzing of every codec and engine (hypothesis, short budget in CI).

Each example is one fuzz input (see ``fuzz/polymux_fuzz.py``): random bytes, or a mutation
of a valid session recorded with polymux itself and against the Node reference peers
(``fuzz/corpus/<format>/``). Only :class:`polymux.ProtocolError` may escape an engine or a
decoder; a run must end (pytest-timeout), and its memory must stay proportional to its
input (checked by the driver on every run, and with tracemalloc below).
"""

from __future__ import annotations

import os
import random
import tracemalloc

import polymux_fuzz as pf
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import polymux


pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("POLYMUX_FUZZ_EXAMPLES", "60"))
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_every_format_has_a_seed_corpus() -> None:
    """A format added to ``polymux.PROTOCOLS`` needs recorded sessions to mutate
    (``fuzz/record_corpus.py --format NAME``)."""
    assert set(pf.FORMATS) == set(polymux.PROTOCOLS)
    for fmt in pf.FORMATS:
        assert len(pf.corpus_inputs(fmt)) >= 4, fmt


@pytest.mark.parametrize("fmt", pf.FORMATS)
def test_recorded_sessions_replay_cleanly(fmt: str) -> None:
    """The corpus holds valid sessions: replayed whole into a fresh engine of the role
    that received them, they raise nothing (so mutations start from deep states)."""
    folder = os.path.join(pf.CORPUS, fmt)
    for name in sorted(os.listdir(folder)):
        if name.startswith("node-") or "pieces" in name:
            continue  # Node sessions carry that peer's own data; pieces are truncated
        with open(os.path.join(folder, name), "rb") as f:
            outcome = pf.drive_engine(fmt, f.read())
        assert outcome.error is None, (name, outcome.error)
        assert outcome.events > 0, name


def _mutate(data: bytes, rng: random.Random, count: int) -> bytes:
    buf = bytearray(data)
    for _ in range(count):
        op = rng.randrange(6)
        pos = rng.randrange(len(buf)) if buf else 0
        if op == 0 and buf:
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[pos] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        elif op == 2:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif op == 3 and buf:
            del buf[pos : pos + rng.randrange(1, 9)]
        elif op == 4 and len(buf) > 1:
            other = rng.randrange(len(buf))
            n = rng.randrange(1, 17)
            buf[pos:pos] = buf[other : other + n]  # duplicate a piece (replayed frames)
        elif op == 5:
            del buf[pos:]  # cut the connection
    return bytes(buf)


@st.composite
def mutated_sessions(draw: st.DrawFn, fmt: str) -> bytes:
    seeds = pf.corpus_inputs(fmt)
    seed = draw(st.sampled_from(seeds))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    data = _mutate(seed[:4096], rng, draw(st.integers(1, 8)))
    if data and draw(st.booleans()):
        data = bytes([draw(st.integers(0, 255))]) + data[1:]  # another role / piece size
    return data


@pytest.mark.parametrize("fmt", pf.FORMATS)
@FUZZ_SETTINGS
@given(data=st.binary(max_size=512))
def test_engine_random_bytes(fmt: str, data: bytes) -> None:
    pf.drive_engine(fmt, data)


@pytest.mark.parametrize("fmt", pf.FORMATS)
@FUZZ_SETTINGS
@given(data=st.data())
def test_engine_mutated_sessions(fmt: str, data: st.DataObject) -> None:
    pf.drive_engine(fmt, data.draw(mutated_sessions(fmt)))


@pytest.mark.parametrize("fmt", pf.FORMATS)
@FUZZ_SETTINGS
@given(data=st.binary(max_size=512))
def test_codec_random_bytes(fmt: str, data: bytes) -> None:
    pf.drive_codec(fmt, data)


@pytest.mark.parametrize("fmt", pf.FORMATS)
@FUZZ_SETTINGS
@given(data=st.data())
def test_codec_mutated_sessions(fmt: str, data: st.DataObject) -> None:
    pf.drive_codec(fmt, data.draw(mutated_sessions(fmt)))


# Peak Python memory of one engine run, beyond the input itself: the engine may hold one
# frame (at most CONFIG.max_message_size / 1 MiB) plus per-channel state; 8 MiB bounds it.
MEMORY_BOUND = 8 * 1024 * 1024


@pytest.mark.parametrize("fmt", pf.FORMATS)
def test_engine_memory_is_bounded(fmt: str) -> None:
    """tracemalloc peak of runs on 256 KiB inputs (random, and a recorded session
    repeated with corruptions) stays under MEMORY_BOUND."""
    rng = random.Random(fmt)
    seeds = pf.corpus_inputs(fmt)
    inputs = [bytes([c]) + rng.randbytes(256 * 1024) for c in (0, 1, 0x1F << 3 | 1)]
    for seed in seeds[:3]:
        body = seed[1:] * (256 * 1024 // max(1, len(seed)) + 1)
        inputs.append(seed[:1] + _mutate(body[: 256 * 1024], rng, 4))
    for data in inputs:
        tracemalloc.start()
        try:
            pf.drive_engine(fmt, data)
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < MEMORY_BOUND, f"{fmt}: peak {peak} bytes for a {len(data)}-byte input"
