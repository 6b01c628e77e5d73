"""A format that polymux has never heard of, registered here and nowhere else
(:mod:`.tinymux`: codec, engine, walk, signature, options, docs text), is picked up by every
layer from its registration alone: the API's entry points, the CLI's choices, capture (both
modes), decode, detection, the pipeline, the bridge, the benchmarks and the docs tables.
(Adding a format: the checklist in docs/design.md.)"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import polymux
from polymux import formats
from polymux.cli import build_parser, main as cli_main
from polymux.formats import Format
from polymux.tracing import (
    CaptureRecorder,
    decode_chunks,
    decode_flow,
    detect,
    heads,
    parse_protocols,
    read_session,
)
from polymux.tracing.capture import read_frames

from .tinymux import NAME, TINYMUX, TinyEngine, TinyOptions


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny() -> Iterator[Format]:
    formats.register(TINYMUX)
    try:
        yield TINYMUX
    finally:
        formats.unregister(NAME)


def test_registering_is_all_it_takes_for_the_registry_and_the_api(tiny: Format) -> None:
    assert NAME in polymux.PROTOCOLS and polymux.PROTOCOLS[-1] == NAME
    assert formats.get(NAME) is tiny and formats.FORMATS[-1] is tiny
    assert formats.resolve(NAME) is tiny
    engine = formats.make_engine(NAME)
    assert isinstance(engine, TinyEngine) and engine.caps is tiny.caps
    configured = tiny.configure(frame_size=100)
    assert configured.options == TinyOptions(frame_size=100)
    assert formats.resolve(configured) is configured
    assert configured.make_engine().max_frame == 100
    with pytest.raises(TypeError, match=r"tinymux has no option window \(its options: frame_size\)"):
        tiny.configure(window=1)
    with pytest.raises(ValueError, match="a format named 'tinymux' is registered already"):
        formats.register(tiny)


def test_unregistered_it_is_unknown_again() -> None:
    assert NAME not in polymux.PROTOCOLS
    with pytest.raises(ValueError, match=f"unknown protocol '{NAME}'"):
        formats.get(NAME)


def test_the_cli_offers_it(tiny: Format) -> None:
    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    offered = []
    for name, sub in subcommands.choices.items():
        for action in sub._actions:
            if action.dest == "protocol" and action.choices is not None:
                assert NAME in action.choices, name
                offered.append(name)
            if action.dest == "protocol" and action.help:
                assert NAME in action.help % {"default": action.default}, name
    assert {"serve", "connect", "demo"} <= set(offered)
    args = parser.parse_args(["serve", "--protocol", NAME, "--tcp", "127.0.0.1:0"])
    assert args.protocol == NAME
    assert parse_protocols([NAME, f"10.0.0.*={NAME}"]) == {"10.0.0.*": NAME, "*": NAME}


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _exchange(session: polymux.Session, payload: bytes) -> bytes:
    reader, writer = await session.open_channel("tiny/1")
    writer.write(payload)
    writer.write_eof()
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


PAYLOAD = bytes(range(256)) * 100  # 25,600 bytes: several 4,096-byte frames each way


def _without_time(records: list[Any]) -> list[tuple[Any, ...]]:
    return [tuple(r._replace(time_ns=0)) for r in records]


async def test_sessions_capture_decode_detect_and_the_pipeline_take_it(tiny: Format, tmp_path: Path) -> None:
    full = CaptureRecorder(tmp_path / "full", frames=True)
    records_only = CaptureRecorder(tmp_path / "records", mode="records")
    try:
        async with asyncio.timeout(30):
            server = await polymux.start_server(_echo, "127.0.0.1", 0, protocol=NAME, capture=records_only)
            async with server:
                session = await polymux.connect("127.0.0.1", server.port, protocol=tiny, capture=full)
                async with session:
                    assert session.protocol == NAME
                    assert await _exchange(session, PAYLOAD) == PAYLOAD
    finally:
        full.close()
        records_only.close()

    # Capture, full mode: the bytes, and the frame records walked as they went.
    capture = read_session(sorted((tmp_path / "full").glob("*.pmcap.parquet")))
    assert capture.format == NAME
    [frames_file] = sorted((tmp_path / "full").glob("*.pmframes.parquet"))
    live = read_frames(frames_file).records
    # Decode: the same walk over the same bytes gives the same records.
    decoded = list(decode_chunks(NAME, capture.chunks, session=capture.session))
    assert _without_time(decoded) == _without_time(live)
    kinds = [(r.direction, r.frame_type) for r in decoded]
    assert kinds[0] == ("c2s", "open") and ("c2s", "end") in kinds and ("s2c", "end") in kinds
    assert {r.format for r in decoded} == {NAME}
    assert {r.channel_name for r in decoded} == {"tiny/1"}
    assert sum(r.length for r in decoded if r.frame_type == "data") == 2 * len(PAYLOAD)
    # Capture, records mode (the server's side): the same frames, seen from the other end.
    [server_frames] = sorted((tmp_path / "records").glob("*.pmframes.parquet"))
    served = read_frames(server_frames).records
    assert [(r.direction, r.frame_type, r.offset, r.length) for r in served] == [
        (r.direction, r.frame_type, r.offset, r.length) for r in decoded
    ]

    # Detection, and decoding a flow of unknown format.
    detection = detect(*heads(capture.chunks))
    assert (detection.format, detection.confidence) == (NAME, 0.9), detection
    flow = decode_flow(capture.chunks, session="flow")
    assert flow.format == NAME and len(list(flow.records)) == len(decoded)

    # polymux decode, on the capture file.
    out = tmp_path / "decoded.txt"
    with out.open("w") as f, contextlib.redirect_stdout(f):
        assert cli_main(["decode", str(tmp_path / "full")]) == 0
    text = out.read_text()
    assert NAME in text and "tiny/1" in text

    # The pipeline's decoding (what its Spark executors run), on the capture and on a
    # packet capture of the same connection, whose format only detection can tell.
    from polymux.pipeline.ingest import decode_units

    [capture_file] = sorted((tmp_path / "full").glob("*.pmcap.parquet"))
    rows = [("unit", str(capture_file), capture_file.read_bytes())]
    table = [batch.to_pydict() for batch in decode_units(rows)]
    assert {f for batch in table for f in batch["format"]} == {NAME}
    assert sum(len(batch["format"]) for batch in table) == len(decoded)

    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from tracing import pcaputil  # tests/tracing/pcaputil.py
    finally:
        sys.path.remove(str(ROOT / "tests"))
    pcap = tmp_path / "tiny.pcap"
    pcaputil.write(pcap, pcaputil.connection(capture.chunks, disorder=False))
    batches = [batch.to_pydict() for batch in decode_units([("pcap", str(pcap), pcap.read_bytes())])]
    assert {f for batch in batches for f in batch["format"]} == {NAME}
    detections = {d for batch in batches for d in batch["detection"]} - {None}
    assert detections == {f"detected {NAME} (confidence 0.90: a tinymux OPEN (type byte e8) first)"}


async def test_the_bridge_carries_it(tiny: Format) -> None:
    async with asyncio.timeout(30):
        server = await polymux.start_server(_echo, "127.0.0.1", 0, protocol="yamux")
        async with server:
            bridge = await polymux.bridge(f"{NAME}:tcp:127.0.0.1:0", f"yamux:tcp:127.0.0.1:{server.port}")
            async with bridge:
                session = await polymux.connect("127.0.0.1", bridge.listen.port, protocol=NAME)
                async with session:
                    assert await _exchange(session, PAYLOAD) == PAYLOAD
            assert bridge.stats.channels == 1


def test_the_benchmarks_measure_it(tiny: Format, capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.suite import build_parser as suite_parser

        from benchmarks import bench_bulk
    finally:
        sys.path.remove(str(ROOT))
    assert suite_parser().parse_args(["--formats", f"yamux,{NAME}"]).formats == ["yamux", NAME]
    argv = [
        "--protocols",
        NAME,
        "--loops",
        "asyncio",
        "--receiver",
        "inline",
        "--size-mib",
        "1",
        "--repeat",
        "1",
    ]
    assert bench_bulk.main([*argv, "-q"]) == 0
    table = capsys.readouterr().out
    rows = [line.split() for line in table.splitlines() if NAME in line.split()]
    assert [row[:4] for row in rows] == [["asyncio", NAME, "1", "chans"], ["asyncio", NAME, "16", "chans"]], (
        table
    )


def test_the_docs_tables_list_it(tiny: Format) -> None:
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        from polymux_docs import FORMAT_TABLES, format_options_rows, format_table
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    for kind in FORMAT_TABLES:
        rows = format_table(kind, "choosing")
        assert len(rows) == 2 + len(formats.FORMATS)
        assert f"`{NAME}`" in rows[-1], (kind, rows[-1])
    assert format_table("capabilities")[-1] == f"| `{NAME}` | yes | none | yes | yes | no | no |"
    assert format_table("choosing")[-1].startswith(
        f"| [`{NAME}`](formats/index.md) | tests/formats/test_new_format.py | none | yes: in the OPEN frame |"
    )
    assert [
        "TinyOptions.frame_size",
        NAME,
        "4 KiB",
        "",
        "The largest frame body we send.",
    ] in format_options_rows()
