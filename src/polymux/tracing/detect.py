"""Decoding a flow whose format is not known, and ``--protocol`` per flow. The detector
itself (:func:`detect`, :class:`Detection`, :func:`heads` ...) is
:mod:`polymux.formats.detect`, below the session layer so that sessions can say what a peer
speaks; it is re-exported here, where ``polymux decode``, ``polymux analyze``, the pipeline
and the commands have always found it.

:func:`decode_flow` decodes one connection: as the format given, or as the detected one;
a decode that runs into a violation (or a truncated frame) within its first
:data:`RETRY_WINDOW` records is retried under the other candidates before any violation is
reported, and the first clean one is kept (else the one that decoded the most bytes).
:func:`forced_format` / :func:`parse_protocols` implement ``--protocol`` per flow.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from polymux.formats import PROTOCOLS
from polymux.formats.detect import HEAD_BYTES, Detection, detect, detect_chunks, detect_format, heads
from polymux.formats.records import C2S, S2C, Chunk, FrameRecord
from polymux.tracing.decode import decode_chunks


__all__ = [
    "HEAD_BYTES",
    "RETRY_WINDOW",
    "DecodedFlow",
    "Detection",
    "decode_flow",
    "detect",
    "detect_chunks",
    "detect_format",
    "forced_format",
    "heads",
    "parse_protocols",
]

RETRY_WINDOW = 8192
"""Records :func:`decode_flow` holds back while it checks that a detected format decodes
cleanly; a violation after them is reported, not retried."""


# -- decoding a flow -----------------------------------------------------------------------


@dataclass
class DecodedFlow:
    """One connection, decoded (:func:`decode_flow`)."""

    format: str | None
    """The format the records were decoded as (``None``: not recognised, no records)."""
    how: str
    """How the format was chosen, for people and reports: ``"forced"``, ``"recorded in
    the capture"``, :meth:`Detection.describe`, plus what a retry did."""
    detection: Detection | None
    """The detection (``None`` when the format was given)."""
    records: Iterator[FrameRecord]
    """The frame records (each at most once: iterate once)."""
    label: str = ""
    """What to call the format for people: :attr:`format`, or ``"mplex or multiplex"``
    when the bytes cannot tell the two apart (one wire; the records were decoded with
    :attr:`format`'s codec, which any of the two would decode the same way)."""

    def __post_init__(self) -> None:
        if not self.label:
            self.label = self.format or "unknown"


def _failures(records: Iterable[FrameRecord]) -> dict[str, FrameRecord]:
    """The first violation or truncation record of each direction."""
    out: dict[str, FrameRecord] = {}
    for r in records:
        if r.frame_type in ("violation", "truncated") and r.direction not in out:
            out[r.direction] = r
    return out


def decode_flow(
    chunks: Sequence[Chunk],
    *,
    session: str,
    format: str | None = None,
    how: str = "forced",
    one_way: bool = False,
    window: int = RETRY_WINDOW,
) -> DecodedFlow:
    """Decode one connection's ``chunks`` (both directions, in time order).

    With ``format``: as that format (``how`` says why, e.g. ``"forced"``,
    ``"recorded in the capture"``). Without: detected (:func:`detect_chunks`); the first
    ``window`` records of each candidate are checked, and one that has a violation or a
    truncated frame among them is dropped for the next candidate. The first clean
    candidate is kept; if none is, the one that decoded the most bytes before its first
    failure (its violations are then reported). ``one_way``: see
    :class:`~polymux.tracing.FrameDecoder`.
    """
    if format is not None:
        return DecodedFlow(format, how, None, decode_chunks(format, chunks, session=session, one_way=one_way))
    detection = detect_chunks(chunks)
    if detection.format is None:
        return DecodedFlow(None, detection.describe(), detection, iter(()))
    totals = {C2S: 0, S2C: 0}
    for _t, direction, data in chunks:
        totals[direction] += len(data)
    failed: list[str] = []
    best: tuple[int, str, list[FrameRecord], Iterator[FrameRecord]] | None = None
    for fmt in detection.candidates:
        it = decode_chunks(fmt, chunks, session=session, one_way=one_way)
        held = list(itertools.islice(it, window))
        failures = _failures(held)
        if not failures:
            how_text = detection.describe(fmt)
            if failed and not detection.ambiguous:
                how_text += f"; {'; '.join(failed)}; decoded as {fmt}"
            elif failed:
                how_text += f"; {'; '.join(failed)}"
            # An ambiguous pair that the decode did not settle (the other one did not fail):
            # name both, not the one whose codec happened to go first.
            label = " or ".join(detection.candidates[:2]) if detection.ambiguous and not failed else fmt
            return DecodedFlow(fmt, how_text, detection, itertools.chain(held, it), label)
        first = min(failures.values(), key=lambda r: r.offset)
        failed.append(f"as {fmt} it fails at {first.direction} offset {first.offset} ({first.error})")
        progress = sum(failures[d].offset if d in failures else totals[d] for d in (C2S, S2C))
        if best is None or progress > best[0]:
            best = (progress, fmt, held, it)
    assert best is not None
    _progress, fmt, held, it = best
    how_text = f"{detection.describe(fmt)}; {'; '.join(failed)}; decoded as {fmt}, which got furthest"
    return DecodedFlow(fmt, how_text, detection, itertools.chain(held, it))


# -- forcing a format ------------------------------------------------------------------------


def forced_format(session: str, protocol: str | Mapping[str, str] | None) -> str | None:
    """The format the user forced for the flow ``session``: ``protocol`` itself when it is
    one format; with a mapping ``{pattern: format}`` (:func:`parse_protocols`), the format
    of the first pattern that matches ``session`` (``fnmatch``, case-sensitive; a pcap
    flow's session is ``"client-server"``, e.g. ``"127.0.0.1:40000-127.0.0.1:9000"``);
    ``None`` when nothing is forced (detect)."""
    if protocol is None:
        return None
    if isinstance(protocol, str):
        return protocol
    for pattern, fmt in protocol.items():
        if fnmatch.fnmatchcase(session, pattern):
            return fmt
    return None


def parse_protocols(values: Sequence[str] | None) -> dict[str, str] | None:
    """``--protocol`` values: ``FORMAT`` (every flow) or ``PATTERN=FORMAT`` (the flows whose
    session matches, see :func:`forced_format`), repeatable, patterns tried in order and a
    bare ``FORMAT`` last. Returns ``{pattern: format}`` (``"*"`` for a bare one), or
    ``None`` for no values. An unknown format or two bare formats raise ``ValueError``."""
    if not values:
        return None
    patterns: dict[str, str] = {}
    default: str | None = None
    for value in values:
        pattern, sep, fmt = value.rpartition("=")
        if fmt not in PROTOCOLS:
            raise ValueError(
                f"unknown format {fmt!r} in --protocol {value!r}; polymux decodes: {', '.join(PROTOCOLS)}"
            )
        if not sep:
            if default is not None and default != fmt:
                raise ValueError(
                    f"--protocol {default} and --protocol {fmt}: give one format for every flow, or FLOW=FORMAT"
                )
            default = fmt
        elif not pattern:
            raise ValueError(f"--protocol {value!r}: the flow pattern before '=' is empty")
        else:
            patterns[pattern] = fmt
    if default is not None:
        patterns["*"] = default
    return patterns
