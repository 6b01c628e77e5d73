"""End-to-end throughput of ``polymux.pipeline`` (ingest + reports) on ``local[2]``.

Synthesises yamux captures (the raw capture file format of ``docs/tracing.md``) of 1 M,
4 M and 16 M frames -- 64 streams sending 8-byte data frames client to server, the server
returning the window in WindowUpdate frames, so credit is tracked on every data frame --
in files of 256 Ki frames each, one session per file. Then runs ``analyze`` on each set
with one SparkSession (started once, warmed up on a small set first) and prints frames/s
for the ingest (decode + frames table in Parquet) and the reports (reports, CSV/Parquet,
HTML) and how the cost grows with size.

    nice .venv/bin/python benchmarks/bench_pipeline.py [--sizes 1,4,16] [--master local[2]]
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


def make_set(folder: Path, frames: int) -> int:
    """Files of about FILE_FRAMES frames adding up to ``frames``; return the exact count."""
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    n = max(1, round(frames / FILE_FRAMES))
    for i in range(n):
        session = f"bench-{frames}-{i}"
        total += write_capture(
            folder / f"{session}.0000.pmcap.parquet", session, frames // n, 1_700_000_000 * 10**9
        )
    return total


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16", help="millions of frames, comma-separated")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args()

    from polymux.pipeline import analyze, build_session

    root = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    try:
        start = time.perf_counter()
        spark = build_session(args.master)
        started = time.perf_counter() - start
        warm = make_set(root / "warm", 100_000)
        analyze([str(root / "warm")], root / "warm-out", spark=spark, progress=False)
        rows = []
        for millions in [float(s) for s in args.sizes.split(",")]:
            folder = root / f"in-{millions:g}M"
            t0 = time.perf_counter()
            frames = make_set(folder, int(millions * (1 << 20)))
            made = time.perf_counter() - t0
            summary = analyze([str(folder)], root / f"out-{millions:g}M", spark=spark, progress=True)
            assert summary.frames == frames, (summary.frames, frames)
            ingest = summary.timings["ingest"]
            report = summary.timings["reports"] + summary.timings["html"]
            rows.append((frames, summary.files, made, ingest, report))
            shutil.rmtree(folder)
            shutil.rmtree(root / f"out-{millions:g}M")
        print(
            f"\npolymux.pipeline on {args.master}: Spark start-up {started:.1f} s (not counted); warm-up {warm:,}"
        )
        print(
            f"{'frames':>12} {'files':>5} {'ingest s':>9} {'reports s':>10} {'total s':>8} "
            f"{'ingest f/s':>11} {'reports f/s':>12} {'end-to-end f/s':>15} {'x time':>7}"
        )
        base: tuple[int, float] | None = None
        for frames, files, _made, ingest, report in rows:
            total = ingest + report
            growth = "" if base is None else f"{(total / base[1]) / (frames / base[0]):.2f}"
            base = base or (frames, total)
            print(
                f"{frames:>12,} {files:>5} {ingest:>9.1f} {report:>10.1f} {total:>8.1f} "
                f"{frames / ingest:>11,.0f} {frames / report:>12,.0f} {frames / total:>15,.0f} {growth:>7}"
            )
        print("x time: (time / first size's time) / (frames / first size's frames); 1.00 = linear")
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
