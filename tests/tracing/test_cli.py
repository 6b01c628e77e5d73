"""``polymux decode`` as a subprocess: a raw one-direction file, a pcap, a pcapng and a
polymux capture, as a table and as JSON; clear errors for unreadable input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from polymux.tracing import FRAME_FIELDS, decode_chunks

from . import pcaputil
from .conftest import Recorded, record_session, stream


def decode(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "polymux", "decode", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    import asyncio

    directory = tmp_path_factory.mktemp("cli")
    return asyncio.run(record_session("yamux", directory, sizes=(100, 70_000)))


def _table_rows(out: str) -> list[list[str]]:
    lines = [line for line in out.splitlines() if line and not line.startswith("==")]
    assert lines[0].split()[:4] == ["time", "dir", "offset", "channel"]
    return [line.split() for line in lines[1:]]


def test_capture_file_table_and_json(recorded: Recorded) -> None:
    path = next(recorded.directory.glob("*-client.0000.pmcap.parquet"))
    expected = list(decode_chunks("yamux", recorded.client.chunks, session=recorded.client.session))

    table = decode(path)
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith(f"== {recorded.client.session}  yamux  client 127.0.0.1:")
    rows = _table_rows(table.stdout)
    assert len(rows) == len(expected)
    for row, r in zip(rows, expected, strict=True):
        assert row[1:6] == [r.direction, str(r.offset), r.channel or "-", r.frame_type, str(r.length)]
        if r.credit is not None:
            assert row[7:9] == [str(r.credit), r.credit_dir]

    js = decode("--json", path)
    assert js.returncode == 0, js.stderr
    objects = [json.loads(line) for line in js.stdout.splitlines()]
    assert [tuple(o) for o in objects] == [tuple(name for name, _ in FRAME_FIELDS)] * len(expected)
    assert [tuple(o.values()) for o in objects] == [tuple(r) for r in expected]


def test_raw_one_direction_file(recorded: Recorded, tmp_path: Path) -> None:
    raw = tmp_path / "server-side.bin"
    raw.write_bytes(stream(recorded.client.chunks, "s2c"))
    result = decode("--direction", "s2c", "--json", raw)  # format detected
    assert result.returncode == 0, result.stderr
    objects = [json.loads(line) for line in result.stdout.splitlines()]
    assert {o["direction"] for o in objects} == {"s2c"}
    assert {o["format"] for o in objects} == {"yamux"}
    assert sum(o["length"] for o in objects if o["frame_type"] == "data") == 100 // 3 + 7 + 70_000 // 3 + 7
    assert all(o["credit"] is None for o in objects)  # one direction: no credit
    assert not [o for o in objects if o["frame_type"] in ("violation", "truncated")]

    table = decode("-p", "yamux", "--direction", "s2c", raw)
    assert table.returncode == 0
    assert table.stdout.startswith("== server-side.bin  yamux  raw s2c bytes")


def test_pcap_and_pcapng_files(recorded: Recorded, tmp_path: Path) -> None:
    expected = list(decode_chunks("yamux", recorded.client.chunks, session="127.0.0.1:40000-127.0.0.1:9000"))
    pcap = tmp_path / "t.pcap"
    pcaputil.write(pcap, pcaputil.connection(recorded.client.chunks), ng=False)
    result = decode(pcap)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "== 127.0.0.1:40000-127.0.0.1:9000  yamux  127.0.0.1:40000 -> 127.0.0.1:9000 (TCP)"
    )
    rows = _table_rows(result.stdout)
    assert [row[1:6] for row in rows] == [
        [r.direction, str(r.offset), r.channel or "-", r.frame_type, str(r.length)] for r in expected
    ]
    pcapng = tmp_path / "t.pcapng"
    pcaputil.write(pcapng, pcaputil.connection(recorded.client.chunks), ng=True)
    js = decode("--json", "--protocol", "yamux", pcapng)
    assert js.returncode == 0, js.stderr
    objects = [json.loads(line) for line in js.stdout.splitlines()]
    assert [tuple(o.values())[3:] for o in objects] == [tuple(r)[3:] for r in expected]
    assert {o["session"] for o in objects} == {"127.0.0.1:40000-127.0.0.1:9000"}


def run_cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    """``polymux decode`` in this process (the checks that need no subprocess)."""
    from polymux.cli import main

    status = main(["decode", *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err


def test_violation_is_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = tmp_path / "bad.bin"
    raw.write_bytes(bytes.fromhex("000200010000000000000007") + b"\x09" * 12)
    status, out, _err = run_cli(capsys, "-p", "yamux", raw)
    assert status == 0
    rows = _table_rows(out)
    assert [row[4] for row in rows] == ["ping", "violation"]
    assert rows[1][2] == "12"
    assert "yamux: frame header version is 9, expected 0" in out


def test_unreadable_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _out, err = run_cli(capsys, tmp_path / "nope.pcap")
    assert status == 1
    assert "cannot read" in err and "nope.pcap" in err

    parquet = tmp_path / "x.pmcap.parquet"
    parquet.write_bytes(b"PAR1 not really")
    status, _out, err = run_cli(capsys, parquet)
    assert status == 1
    assert "is not a readable Parquet file" in err

    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello, this is not a multiplexed stream")
    status, _out, err = run_cli(capsys, junk)
    assert status == 1
    assert "the format is not recognised; name it with --protocol" in err

    pcap = tmp_path / "empty.pcap"
    pcaputil.write(pcap, [])
    status, _out, err = run_cli(capsys, pcap)
    assert status == 1
    assert "no TCP connection with payload" in err

    truncated = tmp_path / "cut.pcap"
    truncated.write_bytes(b"\xd4\xc3\xb2\xa1\x02\x00")
    status, _out, err = run_cli(capsys, truncated)
    assert status == 1
    assert "cut.pcap" in err


def test_mplex_or_multiplex_is_not_reported_as_mplex(tmp_path: Path) -> None:
    """npm multiplex traffic whose names say nothing of the dialect: the same bytes as mplex.
    decode says both, and decodes with the mplex codec (which reads them the same)."""
    raw = tmp_path / "c2s.bin"
    # NewStream 0 "files/1", a message on it, NewStream 1 "files/2", a close of stream 0.
    raw.write_bytes(
        bytes([0 << 3 | 0, 7]) + b"files/1" + bytes([0 << 3 | 2, 5]) + b"hello"
        + bytes([1 << 3 | 0, 7]) + b"files/2" + bytes([0 << 3 | 4, 0])
    )  # fmt: skip
    table = decode(raw)
    assert table.returncode == 0, table.stderr
    first, how = table.stdout.splitlines()[:2]
    assert first.startswith("== c2s.bin  mplex or multiplex  raw c2s bytes"), first
    assert how.startswith("== format: ambiguous: mplex or multiplex (decoded as mplex; confidence "), how
    forced = decode("--protocol", "multiplex", raw)
    assert forced.stdout.startswith("== c2s.bin  multiplex  "), forced.stdout


def test_several_inputs_folders_and_patterns(tmp_path: Path) -> None:
    """Like polymux analyze: files, folders (recursively; a rotated session decoded as one)
    and patterns; an input that gives nothing is named, the others are decoded, exit 1."""
    import asyncio

    rotated = tmp_path / "rotated"
    recorded = asyncio.run(
        record_session(
            "yamux",
            rotated,
            sizes=(200_000, 200_000),
            recorder_options={"rotate_bytes": 65536, "batch_bytes": 16384},
        )
    )
    parts = sorted(rotated.glob("*-client.*.pmcap.parquet"))
    assert len(parts) > 2
    other = tmp_path / "other"
    asyncio.run(record_session("mplex", other, sizes=(100,)))
    (tmp_path / "empty").mkdir()

    out = decode(rotated, other / "*-server.*.pmcap.parquet", tmp_path / "empty", tmp_path / "nosuch.pcap")
    assert out.returncode == 1
    heads = [line for line in out.stdout.splitlines() if line.startswith("== ") and "format:" not in line]
    sessions = [h.split("  ")[0][3:] for h in heads]
    assert len(sessions) == 3, heads  # the rotated session's two sides, and the mplex server
    client = next(h for h in heads if h.startswith(f"== {recorded.client.session}  yamux  client "))
    assert f"(polymux capture, {len(parts)} files)" in client
    assert any("  mplex  server " in h for h in heads)
    assert (
        f"no capture files (*.pmcap.parquet, *.pmframes.parquet, *.pcap, *.pcapng) under '{tmp_path / 'empty'}'"
        in (out.stderr)
    )
    assert f"cannot read {tmp_path / 'nosuch.pcap'}: No such file or directory" in out.stderr
    # The rotated session's records: those of its whole bytes, none cut at a file boundary.
    js = decode("--json", rotated)
    records = [json.loads(line) for line in js.stdout.splitlines()]
    mine = [r for r in records if r["session"] == recorded.client.session]
    expected = list(decode_chunks("yamux", recorded.client.chunks, session=recorded.client.session))
    assert len(mine) == len(expected) and not [
        r for r in mine if r["frame_type"] in ("violation", "truncated")
    ]
