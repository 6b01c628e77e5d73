"""The parts of the pipeline that need no Spark: finding inputs, the executor-side decoding
(``decode_units``) and the ``polymux analyze`` command line."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from polymux.cli import main
from polymux.pipeline import FRAME_TABLE_COLUMNS, decode_units, find_inputs
from polymux.tracing import CaptureRecorder, decode_chunks, read_session
from polymux.wire import yamux


pytestmark = pytest.mark.spark


def _rotated_capture(folder: Path) -> list[Path]:
    """A yamux client capture rotated into several files (every 64 bytes)."""
    with CaptureRecorder(folder, rotate_bytes=64, batch_bytes=32) as recorder:
        sink = recorder({"format": "yamux", "role": "client", "local": "a", "peer": "b"})
        sink.sent([yamux.encode_header(yamux.Type.WINDOW_UPDATE, yamux.Flag.SYN, 1, 0)])
        for i in range(20):
            sink.sent([yamux.encode_header(yamux.Type.DATA, 0, 1, 10) + bytes([i]) * 10])
            if i % 5 == 4:
                sink.received(yamux.encode_header(yamux.Type.WINDOW_UPDATE, 0, 1, 50))
        sink.close()
    return sorted(folder.glob("*.pmcap.parquet"))


def test_find_inputs_groups_rotated_files(tmp_path: Path) -> None:
    files = _rotated_capture(tmp_path / "caps")
    assert len(files) > 2
    (tmp_path / "caps" / "notes.txt").write_text("not a capture")
    (tmp_path / "caps" / "x.pcap").write_bytes(b"")
    found = find_inputs([str(tmp_path / "caps")])
    captures = [f for f in found if f.kind == "capture"]
    assert [f.path for f in captures] == [str(p.resolve()) for p in files]
    assert len({f.unit for f in captures}) == 1
    assert [f.seq for f in captures] == list(range(len(files)))
    assert [f.kind for f in found if f.path.endswith(".pcap")] == ["pcap"]
    assert find_inputs([str(tmp_path / "caps" / "*.pcap")])[0].kind == "pcap"


@pytest.mark.parametrize(
    ("name", "message"),
    [("nothing-here", "no capture files match"), ("notes.txt", "is not a capture file")],
)
def test_find_inputs_errors_name_the_input(tmp_path: Path, name: str, message: str) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=message):
        find_inputs([str(tmp_path / name)])


def test_decode_units_reads_a_rotated_session_as_one_stream(tmp_path: Path) -> None:
    """Rows of one unit decode like the whole session; seq counts up, credit_before is the
    previous credit of the channel and sender."""
    files = _rotated_capture(tmp_path)
    rows = [("unit", str(p), p.read_bytes()) for p in files]
    table = pa.Table.from_batches(list(decode_units(rows)))
    assert table.column_names == FRAME_TABLE_COLUMNS
    session = read_session(files)
    expected = list(decode_chunks(session.format, session.chunks, session=session.session))
    assert table.num_rows == len(expected) > 20
    assert [tuple(r.values())[: len(expected[0])] for r in table.to_pylist()] == [tuple(r) for r in expected]
    assert table.column("seq").to_pylist() == list(range(len(expected)))
    credits = [(r.credit, r.credit_dir, r.channel) for r in expected]
    before = table.column("credit_before").to_pylist()
    last: dict[tuple[str, str], int] = {}
    for (credit, direction, channel), got in zip(credits, before, strict=True):
        if credit is None:
            assert got is None
        else:
            assert got == last.get((channel, direction))
            last[(channel, direction)] = credit
    data = [r for r in expected if r.frame_type == "data"]
    assert sum(r.length for r in data) == 200


def test_cli_analyze_help_needs_no_spark(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["analyze", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--out" in out and "--master" in out and "--protocol" in out


def test_cli_analyze_bad_input_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 1 like every command's input that is missing or unreadable (the exit-status table).
    assert main(["analyze", str(tmp_path / "missing.pcap"), "--out", str(tmp_path / "out")]) == 1
    assert "no capture files match" in capsys.readouterr().err
