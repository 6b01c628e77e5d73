"""Capture files named on a command line: files, folders (searched recursively) and glob
patterns, expanded into the capture files they hold, each with its kind and the unit it
is decoded in (the rotated files of one session belong together). ``polymux decode`` and
``polymux analyze`` (the pipeline's ingest) take their inputs this way."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from polymux.tracing.capture import CAPTURE_SUFFIX, FRAMES_SUFFIX


__all__ = ["CAPTURE_SUFFIX", "FRAMES_SUFFIX", "PCAP_SUFFIXES", "InputFile", "classify", "find_inputs"]

PCAP_SUFFIXES = (".pcap", ".pcapng")
"""Packet capture files (tcpdump, tshark, dumpcap)."""

_ROTATED = re.compile(r"^(?P<session>.+)\.(?P<seq>\d+)\.pm(?P<kind>cap|frames)\.parquet$")


@dataclass(frozen=True)
class InputFile:
    """One input file: its path, its kind (``capture``/``pcap``), the unit it is decoded
    in (a rotated capture's session; otherwise the file itself) and its sequence number."""

    path: str
    kind: str
    unit: str
    seq: int


def classify(path: str) -> InputFile | None:
    """The input file at ``path`` (by its name), or None if it is no capture file."""
    name = os.path.basename(path)
    if name.endswith((CAPTURE_SUFFIX, FRAMES_SUFFIX)):
        kind = "capture" if name.endswith(CAPTURE_SUFFIX) else "frames"
        match = _ROTATED.match(name)
        if match is None:
            return InputFile(path, kind, path, 0)
        unit = os.path.join(os.path.dirname(path), match["session"])
        return InputFile(path, kind, unit, int(match["seq"]))
    if name.endswith(PCAP_SUFFIXES):
        return InputFile(path, "pcap", path, 0)
    return None


def find_inputs(inputs: Iterable[str | os.PathLike[str]]) -> list[InputFile]:
    """Expand files, folders (recursively) and glob patterns into the capture files to
    ingest, sorted by path. A named file of another kind, or a pattern or folder with no
    capture in it, raises ``ValueError`` naming it."""
    found: dict[str, InputFile] = {}
    named: set[str] = set()  # frames files named one by one: taken even beside a capture
    for item in inputs:
        text = os.fspath(item)
        if os.path.isdir(text):
            hits = [
                entry
                for p in sorted(Path(text).rglob("*"))
                if p.is_file() and (entry := classify(str(p.resolve()))) is not None
            ]
            if not hits:
                raise ValueError(
                    f"no capture files (*{CAPTURE_SUFFIX}, *{FRAMES_SUFFIX}, *.pcap, *.pcapng) under {text!r}"
                )
        elif os.path.isfile(text):
            entry = classify(str(Path(text).resolve()))
            if entry is None:
                raise ValueError(
                    f"{text!r} is not a capture file (expected *{CAPTURE_SUFFIX}, *{FRAMES_SUFFIX}, "
                    "*.pcap or *.pcapng)"
                )
            hits = [entry]
            named.add(entry.path)
        else:
            matches = sorted(glob.glob(text, recursive=True))
            hits = [e for m in matches if os.path.isfile(m) and (e := classify(str(Path(m).resolve())))]
            if not hits:
                raise ValueError(f"no capture files match {text!r}")
        for entry in hits:
            found[entry.path] = entry
    # A session recorded with frames=True has both: its bytes are decoded, as always.
    captured = {f.unit for f in found.values() if f.kind == "capture"}
    return [
        found[p]
        for p in sorted(found)
        if found[p].kind != "frames" or found[p].unit not in captured or p in named
    ]
