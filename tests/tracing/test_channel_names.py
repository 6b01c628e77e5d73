"""``FrameRecord.channel_name``: the name a channel was opened with, where the format has
one (MultiplexingStream offers, mplex/multiplex NewStream, omnistreams creation metadata),
on every record of the channel; in ``polymux decode`` and in the recorder's frames files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import polymux
from polymux.engine.omnistreams import encode_metadata
from polymux.tracing import FRAME_FIELDS, decode_chunks
from polymux.wire import omnistreams
from polymux.wire.mplex import Frame, encode_frame

from .conftest import record_session


NAMED = {"mstream-v1", "mstream-v2", "mstream-v3", "mplex", "multiplex", "omnistreams", "omnistreams-legacy"}


def test_the_field_is_last_in_the_contract() -> None:
    assert FRAME_FIELDS[-1] == ("channel_name", "str | None")


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_every_record_of_a_named_channel_carries_its_name(fmt: str, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path, sizes=(100, 70_000), frames=True)
    records = list(decode_chunks(fmt, rec.client.chunks, session="s"))
    names = {r.channel: r.channel_name for r in records if r.channel}
    if fmt not in NAMED:
        assert {r.channel_name for r in records} == {None}
        return
    # record_session opens "ch100" and "ch70000" (omnistreams: a stream each way per pair)
    assert set(names.values()) == {"ch100", "ch70000"}
    for r in records:
        assert r.channel_name == (names[r.channel] if r.channel else None), r
    data = {}
    for r in records:
        if r.frame_type == "data" and r.direction == "c2s":
            data[r.channel_name] = data.get(r.channel_name, 0) + r.length
    assert data == {"ch100": 100, "ch70000": 70_000}
    # the recorder's live frames files carry the column too
    frames = _client_frames(tmp_path)
    assert frames.schema.names[-2:] == ["channel_name", "payload"]  # last of the contract's fields
    assert set(frames.column("channel_name").to_pylist()) - {None} == {"ch100", "ch70000"}


def _client_frames(folder: Path) -> pa.Table:
    return pq.read_table(next(folder.glob("*-client.0000.pmframes.parquet")))


def _mplex_records(fmt: str, *frames: Frame) -> dict[str, str | None]:
    data = b"".join(encode_frame(f) for f in frames)
    return {r.channel: r.channel_name for r in decode_chunks(fmt, [(1, "c2s", data)], session="s")}


def test_an_empty_newstream_body_names_the_stream_by_its_id_in_multiplex_only() -> None:
    frames = (Frame(3, 0, b""), Frame(3, 2, b"data"), Frame(4, 0, "héllo".encode()), Frame(4, 2, b"x"))
    assert _mplex_records("multiplex", *frames) == {"c3": "3", "c4": "héllo"}
    assert _mplex_records("mplex", *frames) == {"c3": "", "c4": "héllo"}


def test_a_reused_id_gets_its_new_name() -> None:
    frames = (
        Frame(0, 0, b"first"),
        Frame(0, 4, b""),
        Frame(0, 0, b"second"),
        Frame(0, 2, b"y"),
    )
    assert _mplex_records("multiplex", *frames) == {"c0": "first", "c0#2": "second"}


def test_omnistreams_names_come_from_json_metadata() -> None:
    numbering = omnistreams.SPEC
    K = omnistreams.Kind
    messages = [
        omnistreams.encode(K.CREATE, 0, encode_metadata("upload-3", 1024), numbering),
        omnistreams.encode(K.CREATE, 1, b"\x00opaque", numbering),
        omnistreams.encode(K.CREATE, 2, json.dumps({"chunkSize": 10}).encode(), numbering),
        omnistreams.encode(K.DATA, 0, b"abc", numbering),
    ]
    data = b"".join(len(m).to_bytes(4, "big") + m for m in messages)
    records = list(decode_chunks("omnistreams", [(1, "c2s", data)], session="s", one_way=True))
    assert [(r.channel, r.frame_type, r.channel_name) for r in records] == [
        ("c0", "open", "upload-3"),
        ("c1", "open", None),  # opaque metadata: no name
        ("c2", "open", None),  # a JSON object without one
        ("c0", "data", "upload-3"),
    ]


def test_polymux_decode_shows_the_name(tmp_path: Path) -> None:
    data = b"".join(encode_frame(f) for f in (Frame(0, 0, "upload-3 ✓".encode()), Frame(0, 2, b"abc")))
    raw = tmp_path / "c2s.bin"
    raw.write_bytes(data)

    def decode(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "polymux", "decode", "-p", "multiplex", *args, str(raw)],
            capture_output=True,
            text=True,
            encoding="utf-8",
            timeout=60,
            check=True,
        )

    rows = [json.loads(line) for line in decode("--json").stdout.splitlines()]
    assert [(r["frame_type"], r["channel_name"]) for r in rows] == [
        ("open", "upload-3 ✓"),
        ("data", "upload-3 ✓"),
    ]
    table = decode().stdout
    assert table.count('name="upload-3 ✓"') == 2
