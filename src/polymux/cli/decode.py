"""polymux decode: list the frames in captures, per connection and direction.

INPUT is a file, a folder (searched recursively for capture files, as polymux analyze
does: *.pmcap.parquet, *.pmframes.parquet, *.pcap, *.pcapng; the rotated files of one
session are decoded as one) or a glob pattern; several may be given. A file is one of:

  - a pcap or pcapng file (tcpdump, tshark, dumpcap): its TCP flows are reassembled and
    each is decoded;
  - a polymux capture (*.pmcap.parquet, written by polymux.tracing.CaptureRecorder),
    which records its format (or a *.pmcap.raw file the recorder has not converted yet);
  - a polymux frames file (*.pmframes.parquet, CaptureRecorder(mode="records") or
    frames=True): its frame records are listed as they were recorded (no decoding);
  - raw bytes of one direction of a connection (--direction, c2s by default: what the
    client sent).

The format of a flow is --protocol's, else the one a polymux capture records, else the
one polymux.tracing.detect tells from the first bytes (with its evidence and
confidence; "ambiguous: mplex or multiplex" where the bytes cannot tell: the connection's
first line then says "mplex or multiplex", the one wire both speak, and the frames are
decoded with the mplex codec unless it fails). A detected format that runs into a violation early is retried under the other
candidates before a violation is listed. --protocol FORMAT applies to every flow;
--protocol PATTERN=FORMAT (repeatable) to the flows whose session id matches the
pattern (fnmatch; a TCP flow's id is client-server, e.g. '*:9000=yamux'). Flows
whose format is not recognised are named on stderr and skipped.

One line per frame: time (seconds since the connection's first captured byte), direction,
byte offset in that direction, channel, frame type, length, flags, the send credit left
after the frame (and whose), the ping id or error, and the channel's name where the format
has one. Each connection starts with two == lines: session, format and where from; how
the format was chosen. --json prints one JSON object per frame instead (the fields of
polymux.tracing.FRAME_FIELDS; how the format was chosen goes to stderr when it was
ambiguous or retried). Protocol violations are listed as violation frames (the exit
status stays 0); an INPUT that cannot be read or decoded, or a folder or pattern without
a capture file, is named on stderr, the others are decoded, and the status is 1. Needs the
pcap extra for packet captures and the capture extra (pyarrow) for polymux captures.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from polymux._extras import require
from polymux.apps.common import EXIT_FAILED, EXIT_OK, EXIT_STATUS
from polymux.formats import PROTOCOLS


if TYPE_CHECKING:
    from polymux.tracing import Chunk, FrameRecord


__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux decode``."""
    p = sub.add_parser(
        "decode",
        help="decode a capture (pcap/pcapng, polymux capture, raw bytes) into a frame listing",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="pcap/pcapng, *.pmcap.parquet, *.pmframes.parquet or raw bytes of one direction; "
        "folders and glob patterns (capture files in them)",
    )
    p.add_argument(
        "--protocol",
        "-p",
        action="append",
        metavar="[PATTERN=]FORMAT",
        help=f"wire format of every flow, or of the flows matching PATTERN (repeatable); "
        f"default: detect. Formats: {', '.join(PROTOCOLS)}",
    )
    p.add_argument(
        "--direction",
        choices=("c2s", "s2c"),
        default="c2s",
        help="raw files: whose bytes these are, the client's (c2s, default) or the server's",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per frame")
    p.set_defaults(func=run, parser=p)


class _Unreadable(Exception):
    """The input cannot be decoded at all."""


def _kind(path: Path) -> str:
    with path.open("rb") as f:
        head = f.read(4)
    if head in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d"):
        return "pcap"
    if head == b"\x0a\x0d\x0d\x0a":
        return "pcapng"
    if head == b"PAR1":
        return "parquet"
    return "raw"


class _Connection:
    """One connection to list: its chunks, how to decode them and how to describe it."""

    def __init__(
        self,
        session: str,
        chunks: list[Chunk],
        title: str,
        format: str | None,
        how: str,
        one_way: bool = False,
        records: list[FrameRecord] | None = None,
    ) -> None:
        self.session = session
        self.chunks = chunks
        self.title = title
        self.format = format
        """The format given (forced or recorded); None: detect."""
        self.how = how
        self.one_way = one_way
        self.records = records
        """Records as recorded (a frames file): listed, not decoded."""


@dataclass
class _Input:
    """One thing to decode: a file named on the command line (its kind told by its bytes),
    or capture files found in a folder or by a pattern (``kind`` from their names; a
    rotated session's files together)."""

    kind: str
    """``"named"``, ``"capture"``, ``"frames"`` or ``"pcap"``."""
    paths: list[Path]


def _inputs(texts: list[str]) -> Iterator[_Input | _Unreadable]:
    """The inputs of the command line, in order; a folder or pattern without a capture
    file gives an :class:`_Unreadable` in its place."""
    from polymux.tracing.inputs import find_inputs

    for text in texts:
        if os.path.isfile(text) or not (os.path.isdir(text) or glob.has_magic(text)):
            yield _Input("named", [Path(text)])  # a missing one says so when it is read
            continue
        try:
            found = find_inputs([text])
        except ValueError as exc:
            yield _Unreadable(str(exc))
            continue
        sessions: dict[str, list[Path]] = {}
        for entry in found:
            if entry.kind == "capture":
                sessions.setdefault(entry.unit, []).append(Path(entry.path))
            else:
                yield _Input(entry.kind, [Path(entry.path)])
        for parts in sessions.values():
            yield _Input("capture", parts)


def _connections(args: argparse.Namespace, item: _Input) -> Iterator[_Connection]:
    from polymux.tracing import forced_format, read_capture, read_pcap, read_session
    from polymux.tracing.capture import RAW_SUFFIX, read_frames

    protocols = args.protocols
    path = item.paths[0]
    if item.kind == "capture":  # the files of one session, found in a folder
        try:
            cap = read_session(item.paths)
        except (OSError, ValueError) as exc:
            raise _Unreadable(str(exc)) from None
        forced = forced_format(cap.session, protocols)
        parts = f"{len(item.paths)} files" if len(item.paths) > 1 else f"part {cap.seq}"
        title = f"{cap.role} {cap.local or '?'}, peer {cap.peer or '?'} (polymux capture, {parts})"
        how = "forced (--protocol)" if forced else "recorded in the capture"
        yield _Connection(cap.session, cap.chunks, title, forced or cap.format, how)
        return
    try:
        kind = _kind(path)
    except OSError as exc:
        raise _Unreadable(f"cannot read {path}: {exc.strerror or exc}") from None
    if kind in ("pcap", "pcapng"):
        try:
            for flow in read_pcap(path):
                gaps = "".join(f", {d} bytes missing after offset {o}" for d, o in sorted(flow.gaps.items()))
                yield _Connection(
                    flow.session,
                    flow.chunks,
                    f"{flow.client} -> {flow.server} (TCP{gaps})",
                    forced_format(flow.session, protocols),
                    "forced (--protocol)",
                )
        except (OSError, ValueError) as exc:
            raise _Unreadable(str(exc)) from None
        return
    if kind == "parquet" and _is_frames_file(path):
        try:
            frames = read_frames(path)
        except (OSError, ValueError) as exc:
            raise _Unreadable(str(exc)) from None
        forced = forced_format(frames.session, protocols)
        if forced and forced != frames.format:
            print(
                f"polymux decode: {frames.session}: --protocol {forced} ignored: a frames file holds "
                f"{frames.format} records, decoded when recorded",
                file=sys.stderr,
            )
        title = f"{frames.role} {frames.local or '?'}, peer {frames.peer or '?'} (polymux frames, part {frames.seq})"
        yield _Connection(
            frames.session, [], title, frames.format, "recorded as frame records", records=frames.records
        )
        return
    if kind == "parquet" or path.name.endswith(RAW_SUFFIX):
        try:
            cap = read_capture(path)
        except (OSError, ValueError) as exc:
            raise _Unreadable(str(exc)) from None
        forced = forced_format(cap.session, protocols)
        title = f"{cap.role} {cap.local or '?'}, peer {cap.peer or '?'} (polymux capture, part {cap.seq})"
        how = "forced (--protocol)" if forced else "recorded in the capture"
        yield _Connection(cap.session, cap.chunks, title, forced or cap.format, how)
        return
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _Unreadable(f"cannot read {path}: {exc.strerror or exc}") from None
    chunks: list[Chunk] = [(0, args.direction, data)] if data else []
    yield _Connection(
        path.name,
        chunks,
        f"raw {args.direction} bytes, {len(data)} bytes",
        forced_format(path.name, protocols),
        "forced (--protocol)",
        one_way=True,
    )


def _is_frames_file(path: Path) -> bool:
    """A Parquet file with the frames file's version key (not a capture)."""
    pq = require("pyarrow.parquet", "decoding a polymux capture")

    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception:  # noqa: BLE001 - not readable as Parquet: read_capture says why
        return False
    return b"polymux.frames.version" in meta


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _print_table(conn: _Connection, fmt: str, how: str, records: Iterable[FrameRecord], out: TextIO) -> None:
    if conn.records is not None:
        start = conn.records[0].time_ns if conn.records else 0
    else:
        start = conn.chunks[0][0] if conn.chunks else 0
    out.write(f"== {conn.session}  {fmt}  {conn.title}\n== format: {how}\n")
    out.write(
        f"{'time':>11} {'dir':3} {'offset':>10} {'channel':<9} {'type':<13} {'length':>8} {'flags':>6} "
        f"{'credit left':>15}\n"
    )
    for r in records:
        credit = "-" if r.credit is None else f"{r.credit} {r.credit_dir}"
        extra = []
        if r.ping_id is not None:
            extra.append(f"id={r.ping_id}")
        if r.error is not None:
            extra.append(r.error)
        if r.channel_name is not None:
            extra.append(f"name={json.dumps(r.channel_name, ensure_ascii=False)}")
        out.write(
            f"{(r.time_ns - start) / 1e9:>11.6f} {r.direction:3} {r.offset:>10} {r.channel or '-':<9} "
            f"{r.frame_type:<13} {r.length:>8} {r.flags:>#6x} {credit:>15}"
            + (f"  {' '.join(extra)}" if extra else "")
            + "\n"
        )


def run(args: argparse.Namespace) -> int:
    """Decode and print every input; 0 on success, 1 when one cannot be read or decoded
    (the others are decoded all the same)."""
    try:
        args.protocols = _protocols(args.protocol)
    except ValueError as exc:
        args.parser.error(str(exc))
    out = sys.stdout
    status = EXIT_OK
    first = True
    try:
        for item in _inputs(args.inputs):
            if isinstance(item, _Unreadable):
                print(f"polymux decode: {item}", file=sys.stderr)
                status = EXIT_FAILED
                continue
            try:
                decoded, first = _decode(args, item, out, first)
            except _Unreadable as exc:
                print(f"polymux decode: {exc}", file=sys.stderr)
                status = EXIT_FAILED
                continue
            if decoded is None:
                status = EXIT_FAILED
            elif decoded == 0:
                where = item.paths[0]
                print(f"polymux decode: {where}: no TCP connection with payload in it", file=sys.stderr)
                status = EXIT_FAILED
        out.flush()
    except BrokenPipeError:  # decode ... | head
        sys.stderr.close()
        return EXIT_OK
    return status


def _protocols(values: list[str] | None) -> dict[str, str] | None:
    from polymux.tracing import parse_protocols

    return parse_protocols(values)


def _decode(args: argparse.Namespace, item: _Input, out: TextIO, first: bool) -> tuple[int | None, bool]:
    """Print the connections of one input: ``(how many, first)``; how many is None when a
    connection's format could not be recognised."""
    from polymux.tracing import DecodedFlow, decode_flow

    seen = 0
    unrecognised = False
    for conn in _connections(args, item):
        seen += 1
        if conn.records is not None:
            flow = DecodedFlow(conn.format, conn.how, None, iter(conn.records))
        else:
            flow = decode_flow(
                conn.chunks, session=conn.session, format=conn.format, how=conn.how, one_way=conn.one_way
            )
        if flow.format is None:
            why = flow.detection.evidence if flow.detection is not None else flow.how
            print(
                f"polymux decode: {conn.session}: the format is not recognised; name it with "
                f"--protocol ({why})",
                file=sys.stderr,
            )
            unrecognised = True
            continue
        if args.json:
            detection = flow.detection
            if detection is not None and (detection.ambiguous or flow.format != detection.format):
                print(f"polymux decode: {conn.session}: {flow.how}", file=sys.stderr)
            out.writelines(
                json.dumps(r._asdict(), separators=(",", ":"), ensure_ascii=False) + "\n"
                for r in flow.records
            )
        else:
            if not first:
                out.write("\n")
            _print_table(conn, flow.label, flow.how, flow.records, out)
        first = False
    return (None if unrecognised else seen), first
