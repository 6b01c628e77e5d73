"""End-to-end throughput of ``polymux.pipeline`` (ingest + reports) on ``local[2]``.

Synthesises yamux captures of 1 M, 4 M and 16 M frames -- 64 streams sending 8-byte data
frames client to server, the server returning the window in WindowUpdate frames, so credit
is tracked on every data frame -- in files of 256 Ki frames each, one session per file, in
either input form (``--inputs``): ``raw``, the full capture file format of
``docs/tracing.md`` (``*.pmcap.parquet``, decoded by the ingest), or ``records``, the
frames files ``CaptureRecorder(mode="records")`` writes (``*.pmframes.parquet``: the same
sessions' frame records, made by decoding the raw form once, outside the clock). Then
runs ``analyze`` on each set with one SparkSession (started once, warmed up on a small set
first) and prints frames/s for the ingest (decode + frames table in Parquet) and the
reports (reports, CSV/Parquet, HTML) and how the cost grows with size.

    nice .venv/bin/python benchmarks/bench_pipeline.py [--sizes 1,4,16] [--inputs raw,records]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path


# Run as a script, this folder comes first on sys.path, where benchmarks/profile.py would
# shadow the stdlib's profile module (which pyspark imports): drop it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import pyarrow as pa
import pyarrow.parquet as pq

from polymux.wire import yamux


STREAMS = 64
PER_STREAM = 64  # data frames per stream per block
PAYLOAD = b"abcdefgh"
FILE_FRAMES = 1 << 18
BLOCK_NS = 10_000_000  # 10 ms of capture time per block


def _blocks() -> tuple[bytes, bytes, bytes, int]:
    """(opening c2s bytes, c2s block, s2c block, frames per block)."""
    ids = [2 * i + 1 for i in range(STREAMS)]
    opening = b"".join(yamux.encode_header(yamux.Type.WINDOW_UPDATE, yamux.Flag.SYN, sid, 0) for sid in ids)
    frame = {sid: yamux.encode_header(yamux.Type.DATA, 0, sid, len(PAYLOAD)) + PAYLOAD for sid in ids}
    c2s = b"".join(frame[sid] for _ in range(PER_STREAM) for sid in ids)
    credit = PER_STREAM * len(PAYLOAD)
    s2c = b"".join(yamux.encode_header(yamux.Type.WINDOW_UPDATE, 0, sid, credit) for sid in ids)
    return opening, c2s, s2c, STREAMS * PER_STREAM + STREAMS


def write_capture(path: Path, session: str, frames: int, start_ns: int) -> int:
    """Write one raw yamux capture of about ``frames`` frames; return the exact count."""
    opening, c2s, s2c, per_block = _blocks()
    blocks = max(1, frames // per_block)
    times = [start_ns]
    directions = ["c2s"]
    data = [opening]
    for b in range(blocks):
        t = start_ns + (b + 1) * BLOCK_NS
        times += [t, t + BLOCK_NS // 2]
        directions += ["c2s", "s2c"]
        data += [c2s, s2c]
    table = pa.table(
        {"time_ns": pa.array(times, pa.int64()), "direction": directions, "data": pa.array(data, pa.binary())}
    )
    meta = {
        "polymux.capture.version": "1",
        "session": session,
        "format": "yamux",
        "role": "client",
        "local": "127.0.0.1:40000",
        "peer": "127.0.0.1:9000",
    }
    table = table.replace_schema_metadata(meta)
    pq.write_table(table, path)
    return STREAMS + blocks * per_block


def make_set(folder: Path, frames: int, inputs: str = "raw") -> int:
    """Files of about FILE_FRAMES frames adding up to ``frames``; return the exact count.
    ``inputs``: raw captures, or the frames files of the same sessions (``records``)."""
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    n = max(1, round(frames / FILE_FRAMES))
    template: pa.Table | None = None
    for i in range(n):
        session = f"bench-{frames}-{i}"
        raw = folder / f"{session}.0000.pmcap.parquet"
        count = write_capture(raw, session, frames // n, 1_700_000_000 * 10**9)
        total += count
        if inputs == "records":
            if template is None or template.num_rows != _records_of(raw).num_rows:
                template = _records_of(raw)
            _write_frames_file(folder / f"{session}.0000.pmframes.parquet", template, session)
            raw.unlink()
    return total


def _records_of(path: Path) -> pa.Table:
    """The frame records of a raw capture, as a frames file holds them."""
    from polymux.tracing import decode_chunks, read_capture
    from polymux.tracing.capture import _records_table

    capture = read_capture(path)
    records = list(decode_chunks(capture.format, capture.chunks, session=capture.session))
    return _records_table(records, [None] * len(records))


def _write_frames_file(path: Path, template: pa.Table, session: str) -> None:
    """``template``'s records as session ``session``'s frames file."""
    from polymux.tracing.capture import FRAMES_VERSION

    column = template.schema.get_field_index("session")
    table = template.set_column(column, template.schema.field(column), pa.repeat(session, template.num_rows))
    meta = {
        "polymux.frames.version": FRAMES_VERSION,
        "polymux.frames.mode": "records",
        "polymux.frames.payload_prefix": "0",
        "session": session,
        "format": "yamux",
        "role": "client",
        "local": "127.0.0.1:40000",
        "peer": "127.0.0.1:9000",
        "seq": "0",
    }
    pq.write_table(table.replace_schema_metadata(meta), path, compression="zstd")


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16", help="millions of frames, comma-separated")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument(
        "--inputs",
        default="raw,records",
        help="input forms, comma-separated: raw (full captures, decoded) and/or records (frames files)",
    )
    args = parser.parse_args()
    forms = [f.strip() for f in args.inputs.split(",") if f.strip()]
    if not forms or set(forms) - {"raw", "records"}:
        parser.error(f"--inputs: raw and/or records, got {args.inputs!r}")

    from polymux.pipeline import analyze, build_session

    root = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    try:
        start = time.perf_counter()
        spark = build_session(args.master)
        started = time.perf_counter() - start
        for form in forms:
            warm = make_set(root / f"warm-{form}", 100_000, form)
            analyze([str(root / f"warm-{form}")], root / f"warm-out-{form}", spark=spark, progress=False)
        rows = []
        for form in forms:
            for millions in [float(s) for s in args.sizes.split(",")]:
                folder = root / f"in-{form}-{millions:g}M"
                t0 = time.perf_counter()
                frames = make_set(folder, int(millions * (1 << 20)), form)
                made = time.perf_counter() - t0
                out = root / f"out-{form}-{millions:g}M"
                summary = analyze([str(folder)], out, spark=spark, progress=True)
                assert summary.frames == frames, (summary.frames, frames)
                ingest = summary.timings["ingest"]
                report = summary.timings["reports"] + summary.timings["html"]
                rows.append((form, frames, summary.files, made, ingest, report))
                shutil.rmtree(folder)
                shutil.rmtree(out)
        print(
            f"\npolymux.pipeline on {args.master}: Spark start-up {started:.1f} s (not counted); warm-up {warm:,}"
        )
        print(
            f"{'input':>7} {'frames':>12} {'files':>5} {'ingest s':>9} {'reports s':>10} {'total s':>8} "
            f"{'ingest f/s':>11} {'reports f/s':>12} {'end-to-end f/s':>15} {'x time':>7}"
        )
        bases: dict[str, tuple[int, float]] = {}
        for form, frames, files, _made, ingest, report in rows:
            total = ingest + report
            base = bases.get(form)
            growth = "" if base is None else f"{(total / base[1]) / (frames / base[0]):.2f}"
            bases.setdefault(form, (frames, total))
            print(
                f"{form:>7} {frames:>12,} {files:>5} {ingest:>9.1f} {report:>10.1f} {total:>8.1f} "
                f"{frames / ingest:>11,.0f} {frames / report:>12,.0f} {frames / total:>15,.0f} {growth:>7}"
            )
        print("x time: (time / first size's time) / (frames / first size's frames); 1.00 = linear")
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
