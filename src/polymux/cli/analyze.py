"""polymux analyze INPUTS... --out DIR: decode captures with Spark and write traffic
reports (CSV, Parquet, index.html with plots). INPUTS are polymux captures
(*.pmcap.parquet), pcap/pcapng files, folders (searched recursively) or glob patterns.
A packet-capture flow's format is detected from its first bytes (polymux decode does the
same), unless --protocol forces it; the sessions report says how it was chosen. Spark
runs embedded (local[*]) unless --master says otherwise; under spark-submit the
submitted master is used. Needs the spark and pcap extras (pip install
'polymux[spark,pcap]') and Java 17 or newer. Inputs that match no capture file, and a
missing extra (the message says what to install), exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
from pathlib import Path

from polymux.apps.common import EXIT_FAILED, EXIT_OK, EXIT_STATUS


__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux analyze``."""
    from polymux.formats import PROTOCOLS

    parser = sub.add_parser(
        "analyze",
        help="analyse captures with Spark (reports + HTML)",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="capture files, folders or glob patterns")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    parser.add_argument(
        "--protocol",
        action="append",
        metavar="[PATTERN=]FORMAT",
        help="format of the packet-capture flows, or of those whose session id matches PATTERN "
        f"(fnmatch, e.g. '*:9000=yamux'; repeatable); default: detect; polymux captures record "
        f"their own. Formats: {', '.join(PROTOCOLS)}",
    )
    parser.add_argument(
        "--master", default=None, help="Spark master URL (default local[*]; spark-submit's wins)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.set_defaults(func=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    """Run the pipeline; print where the report is."""
    from polymux.tracing import parse_protocols

    try:
        protocol = parse_protocols(args.protocol)
    except ValueError as exc:
        args.parser.error(str(exc))
    # The spark extra, checked before anything runs or is created (a missing one left an
    # empty --out folder behind); dpkt is needed by pcap inputs only, found as they are read.
    missing = [m for m in ("pyspark", "pyarrow", "pandas") if importlib.util.find_spec(m) is None]
    if missing:
        return _missing(missing[0])
    out = Path(args.out)
    existed = out.exists()
    try:
        from polymux.pipeline import analyze

        summary = analyze(
            args.inputs, args.out, protocol=protocol, master=args.master, progress=not args.quiet
        )
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in _EXTRAS:
            raise
        _forget(out, existed)
        return _missing(exc.name.split(".")[0])
    except ValueError as exc:  # inputs that match no capture file, or cannot be read
        _forget(out, existed)
        print(f"polymux analyze: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"{summary.sessions} sessions, {summary.frames:,} frames, {summary.stalls} stalls, "
        f"{summary.violations} violations -> {summary.out / 'index.html'}"
    )
    return EXIT_OK


def _missing(module: str) -> int:
    print(
        f"polymux analyze: this needs {module}, which is not installed: pip install 'polymux[spark,pcap]'",
        file=sys.stderr,
    )
    return EXIT_FAILED


def _forget(out: Path, existed: bool) -> None:
    """A run that failed leaves no --out folder it created and left empty."""
    if not existed:
        with contextlib.suppress(OSError):
            out.rmdir()  # only if empty: a report already written stays


# The third-party packages of the spark and pcap extras (a missing one is an install problem).
_EXTRAS = ("pyspark", "pyarrow", "pandas", "dpkt", "py4j")
