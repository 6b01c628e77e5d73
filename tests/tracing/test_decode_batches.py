"""``decode_batches`` (the pipeline's decode: Arrow batches, vectorised runs where a walk
has them) gives exactly the records of the codec alone, in the same order: every format,
real sessions, violations and cuts; and yamux traffic of many small frames per chunk, where
the vectorised runs take most frames and the general path the rest (opens, ends, pings,
streams not seen opening, an overrun)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import polymux
from polymux.formats import columns
from polymux.formats.yamux import YamuxWalk
from polymux.tracing import FrameDecoder, FrameRecord, decode_batches, frame_schema
from polymux.tracing.records import Chunk
from polymux.wire import yamux

from .conftest import record_session, stream
from .test_live_decode import _captures, _options, _reference
from .test_violations import CORRUPT, _rebuild


def _rows(batches: list[pa.RecordBatch]) -> list[FrameRecord]:
    table = pa.Table.from_batches(batches, schema=frame_schema())
    return [FrameRecord(*row) for row in zip(*(c.to_pylist() for c in table.columns), strict=True)]


def _batched(fmt: str, chunks: list[Chunk], rows: int = 100, one_way: bool = False) -> list[FrameRecord]:
    batches = list(decode_batches(fmt, chunks, session="s", rows=rows, one_way=one_way))
    assert all(b.schema == frame_schema() for b in batches)
    assert all(b.num_rows >= rows for b in batches[:-1])
    return _rows(batches)


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_batches_equal_the_codec(fmt: str, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path, sizes=(1, 5_000, 70_001), **_options(fmt))
    for chunks in _captures(rec):
        expected = _reference(fmt, chunks)[0]
        assert _batched(fmt, chunks) == expected
        assert _batched(fmt, chunks, rows=1 << 20) == expected


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_batches_of_violations_and_cuts(fmt: str, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path, sizes=(2_000, 50_000), **_options(fmt))
    chunks = rec.client.chunks
    offsets = sorted({r.offset for r in _reference(fmt, chunks)[0] if r.direction == "c2s"})
    corrupt, _message = CORRUPT[fmt]
    whole = stream(chunks, "c2s")
    at = offsets[len(offsets) // 2]
    for bad in (_rebuild(chunks, "c2s", corrupt(whole, at)), _rebuild(chunks, "c2s", whole[: at + 3])):
        assert _batched(fmt, bad, rows=7) == _reference(fmt, bad)[0]


def _header(kind: int, flags: int, sid: int, length: int) -> bytes:
    return yamux.encode_header(kind, flags, sid, length)


def _many_small_frames(seed: int) -> list[Chunk]:
    """Both directions of a yamux session whose chunks hold hundreds of small frames:
    plain data and window updates mostly, with opens, ends, pings, empty updates, a stream
    the capture never saw opening, cuts inside frames."""
    rng = random.Random(seed)
    sent = dict.fromkeys((1, 3, 5, 7), 0)
    c2s = bytearray(b"".join(_header(1, 1, sid, 0) for sid in (1, 3, 5)))  # 7: never opened
    s2c = bytearray(b"".join(_header(1, 2, sid, 0) for sid in (1, 3, 5)))
    for _ in range(6000):
        sid = rng.choice((1, 3, 5, 7))
        roll = rng.random()
        n = rng.choice((1, 8, 100, 300))
        if roll < 0.002:
            c2s += _header(2, 1, 0, rng.randrange(1 << 32))  # a ping
        elif roll < 0.004:
            s2c += _header(1, 0, sid, 0)  # an empty update: the general path
        elif roll < 0.4:
            s2c += _header(1, 0, sid, rng.randint(1, 1000))  # a grant
        elif sent[sid] + n <= yamux.INITIAL_WINDOW:  # (never past the first window)
            sent[sid] += n
            flags = 4 if roll < 0.402 else 0  # data with FIN: the general path
            c2s += _header(0, flags, sid, n) + bytes([sid]) * n
    parts: dict[str, list[bytes]] = {}
    for direction, data in (("c2s", bytes(c2s)), ("s2c", bytes(s2c))):
        parts[direction] = []
        pos = 0
        while pos < len(data):
            n = rng.choice((5, 3000, 20_000, 100_000))
            parts[direction].append(data[pos : pos + n])
            pos += n
    chunks: list[Chunk] = []
    while parts["c2s"] or parts["s2c"]:  # the directions interleaved, each in order
        direction = rng.choice([d for d in parts if parts[d]])
        chunks.append((len(chunks), direction, parts[direction].pop(0)))
    return chunks


def _overrun() -> list[Chunk]:
    """A data frame past stream 1's window, in the middle of a long run of small ones."""
    small = _header(0, 0, 1, 100) + bytes(100)
    fit = yamux.INITIAL_WINDOW // 100
    return [(1, "c2s", _header(1, 1, 1, 0) + small * (fit + 1) + small * 300)]


class _Counting(columns.RecordColumns):
    """Counts the rows the vectorised runs add, and their window updates."""

    vectorised = 0
    updates = 0

    def add(self, *args: Any) -> None:
        _Counting.vectorised += len(args[2])
        _Counting.updates += int((args[4] == columns.FRAME_TYPE_CODES["window_update"]).sum())
        super().add(*args)


@pytest.mark.parametrize("seed", range(4))
def test_yamux_runs_equal_the_codec(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = _many_small_frames(seed)
    expected = _reference("yamux", chunks)[0]
    assert {"open", "end", "ping", "data", "window_update"} <= {r.frame_type for r in expected}
    monkeypatch.setattr(columns, "RecordColumns", _Counting)
    _Counting.vectorised = _Counting.updates = 0
    for rows in (1, 1000, 1 << 20):
        assert _batched("yamux", chunks, rows=rows) == expected
    assert _Counting.vectorised > len(expected)  # most records, each time
    assert _Counting.updates > 1000
    one_way = [c for c in chunks if c[1] == "c2s"]
    reference = FrameDecoder("yamux", session="s", one_way=True, codec_only=True)
    records = [r for chunk in one_way for r in reference.feed(chunk)] + reference.finish()
    assert _batched("yamux", one_way, one_way=True) == records  # no credit: no runs either


def test_yamux_overrun_in_a_run_is_the_general_paths_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = _overrun()
    expected = _reference("yamux", chunks)[0]
    assert expected[-1].frame_type == "violation" and "overran its send window" in (expected[-1].error or "")
    monkeypatch.setattr(columns, "RecordColumns", _Counting)
    _Counting.vectorised = 0
    assert _batched("yamux", chunks) == expected
    assert _Counting.vectorised >= YamuxWalk.COLUMN_RUN_MIN  # the frames before it: vectorised


def test_record_columns_round_trip_with_a_big_channel_table() -> None:
    """Records through RecordColumns come back as they went in: nulls, errors, names,
    ping ids; also once the session's channel table is far bigger than a batch."""
    held = columns.RecordColumns()

    def rec(i: int) -> FrameRecord:
        return FrameRecord(
            "s", ("c2s", "s2c")[i % 2], i, "mplex", 10 * i, f"c{i}#2", ("data", "ping", "violation")[i % 3],
            i, i % 4, None if i % 2 else -i, ("", "c2s", "s2c")[i % 3], i if i % 3 == 1 else None,
            "bad" if i % 3 == 2 else None, f"name {i % 5}" if i % 7 else None,
        )  # fmt: skip

    first = [rec(i) for i in range(5000)]
    held.add_records(first)
    assert _rows([pa.RecordBatch.from_arrays(held.arrays("s", "mplex"), schema=frame_schema())]) == first
    held.clear()
    again = [rec(i) for i in range(4990, 5003)]  # 13 rows; 5,003 channels known
    held.add_records(again)
    assert _rows([pa.RecordBatch.from_arrays(held.arrays("s", "mplex"), schema=frame_schema())]) == again
