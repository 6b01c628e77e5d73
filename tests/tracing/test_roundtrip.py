"""Record a real session of every format with CaptureRecorder, read it back and decode it:
the data bytes per channel are exactly what was sent, frames come in a sane order, both
sides' captures agree byte for byte, and the live frame records equal a later decode."""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import polymux
from polymux.tracing import FRAME_FIELDS, FRAME_TYPES, FrameDecoder, decode_chunks, frame_schema
from polymux.tracing.capture import frames_file_schema

from .conftest import SIZES, data_bytes, record_session, reply_size, stream, without_time


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_round_trip_every_format(fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec = await record_session(fmt, tmp_path, frames=True)

    def no_replay(*args: object) -> None:
        raise AssertionError(f"{fmt}: the frame size formula disagrees with the codec")

    monkeypatch.setattr(FrameDecoder, "_exact_sizes", no_replay)
    client, server = rec.client, rec.server
    assert client.format == server.format == fmt
    assert (client.role, server.role) == ("client", "server")
    assert client.local == server.peer and client.peer == server.local
    # Both sides saw the same bytes each way.
    for direction in ("c2s", "s2c"):
        assert stream(client.chunks, direction) == stream(server.chunks, direction)

    records = list(decode_chunks(fmt, client.chunks, session=client.session))
    assert {r.frame_type for r in records} <= set(FRAME_TYPES)
    bad = [r for r in records if r.frame_type in ("violation", "truncated")]
    assert not bad
    counts = data_bytes(records)
    assert counts["c2s"] == Counter(SIZES)
    assert counts["s2c"] == Counter(reply_size(n) for n in SIZES)

    # Offsets: every frame starts where the previous one of its direction ended; records of
    # one frame share the offset; each direction's last frame ends at its stream's end.
    for direction in ("c2s", "s2c"):
        offsets = [r.offset for r in records if r.direction == direction]
        assert offsets == sorted(offsets)
        assert offsets[0] == 0
        assert offsets[-1] < len(stream(client.chunks, direction))

    # Per channel and direction: open before data before end; nothing after a reset/close
    # but the close of the other side.
    per: dict[tuple[str, str], list[str]] = {}
    for r in records:
        if r.channel:
            per.setdefault((r.channel, r.direction), []).append(r.frame_type)
    for (channel, direction), types in per.items():
        text = " ".join(types)
        assert re.fullmatch(
            r"(open |open_ack )?((data|window_update|stop_reading) )*(end )?((data|window_update) )*(close|reset)?",
            text + " ",
        ) or re.fullmatch(r"(open |open_ack )?((data|window_update) )*(end )?(close )?", text + " "), (
            channel,
            direction,
            text,
        )
        if "data" in types and "end" in types:
            assert types.index("end") > max(i for i, t in enumerate(types) if t == "data")
    opens = [r for r in records if r.frame_type == "open"]
    assert len(opens) >= len(SIZES)

    # Flow control: credit never negative, and stays within what was granted.
    if fmt in ("mstream-v2", "mstream-v3", "yamux", "omnistreams", "omnistreams-legacy"):
        credits = [r for r in records if r.credit is not None]
        assert credits
        assert all(r.credit >= 0 and r.credit_dir in ("c2s", "s2c") for r in credits)
    else:
        assert all(r.credit is None and r.credit_dir == "" for r in records)

    # The frames file written live by the recorder equals this decode.
    frames_files = sorted(
        p for p in rec.recorder_paths if "-client." in p.name and p.name.endswith("pmframes.parquet")
    )
    assert frames_files
    table = pq.read_table(frames_files[0])
    assert table.schema.remove_metadata() == frames_file_schema()
    assert table.schema.metadata[b"polymux.frames.version"] == b"1"
    assert [tuple(row.values())[:-1] for row in table.to_pylist()] == [tuple(r) for r in records]
    assert [name for name, _ in FRAME_FIELDS] + ["payload"] == table.column_names
    assert frames_file_schema().remove(len(FRAME_FIELDS)) == frame_schema()


@pytest.mark.parametrize("fmt", ["yamux", "mstream-v2", "mplex", "streamux", "omnistreams"])
async def test_any_chunking_gives_the_same_records(fmt: str, tmp_path: Path) -> None:
    """Re-split each direction's bytes at random points (down to single bytes) and the
    records are the same, apart from times."""
    rec = await record_session(fmt, tmp_path, sizes=(3, 30_000, 100_001))
    chunks = rec.client.chunks
    expected = without_time(decode_chunks(fmt, chunks, session="s"))
    rng = random.Random(fmt)
    resplit = []
    for t, d, data in chunks:
        pos = 0
        while pos < len(data):
            n = rng.choice((1, 1, 2, 3, 7, 100, 5000, 70_000))
            resplit.append((t, d, data[pos : pos + n]))
            pos += n
    assert len(resplit) > 2 * len(chunks)
    assert without_time(decode_chunks(fmt, resplit, session="s")) == expected
