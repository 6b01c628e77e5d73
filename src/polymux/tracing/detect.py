"""Which wire format a connection speaks: the one detector ``polymux decode``, ``polymux
analyze``, the pipeline and the CLI use, and the decoding of a flow whose format is not
known.

:func:`detect` looks at the first bytes each side sent (:func:`heads` takes them from a
capture's chunks: the first :data:`HEAD_BYTES` of each direction) and returns a
:class:`Detection`: the format, every format the bytes fit (the candidates, best first),
a confidence and the evidence in words. What tells the formats apart is each registered
format's own signature (:class:`polymux.formats.Signature`, in the format's module):
handshake signatures first (a magic number, a handshake: ``mstream-v1``, ``mstream-v2``,
``streamux``), and only when none fits the frame signatures (``yamux``, ``mstream-v3``,
``omnistreams``, mplex and multiplex, ``smux`` ...). A frame signature decodes the heads
with its format's walk, which must give whole frames and no violation; it gains
confidence with the number of frames (a fixed-layout frame counts most). Other formats
that fit about as well lower the confidence; two formats of one family (mplex and
multiplex: one wire, other conventions) that fit equally well make the detection
*ambiguous* (``"ambiguous: mplex or multiplex"``).

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

from polymux.formats import FORMATS, PROTOCOLS, Fit, Format, Signature, get
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

HEAD_BYTES = 4096
"""Bytes of each direction :func:`heads` gives the detector."""

RETRY_WINDOW = 8192
"""Records :func:`decode_flow` holds back while it checks that a detected format decodes
cleanly; a violation after them is reported, not retried."""


@dataclass(frozen=True, slots=True)
class Detection:
    """What :func:`detect` found."""

    format: str | None
    """The format to decode with: the best candidate (for an ambiguous mplex/multiplex
    flow, ``mplex``, the stricter of the two); ``None`` when nothing fits."""
    candidates: tuple[str, ...] = ()
    """Every format the first bytes fit, best first (what a decoder falls back to)."""
    confidence: float = 0.0
    """0 to 1: how sure the detection is (a magic number or handshake that only this
    format has is near 1; a few frames less; other formats that fit too lower it)."""
    evidence: str = ""
    """Why, in words."""
    ambiguous: bool = False
    """The bytes cannot tell the first two candidates apart (the same wire: mplex or
    multiplex)."""

    def __str__(self) -> str:
        if self.format is None:
            return "unknown"
        if self.ambiguous:
            return f"ambiguous: {' or '.join(self.candidates[:2])}"
        return self.format

    def describe(self, decoded_as: str | None = None) -> str:
        """One line for people: the verdict, the confidence and the evidence (and, for an
        ambiguous one, the candidate decoded as: ``decoded_as``, else the first)."""
        if self.format is None:
            return f"not recognised ({self.evidence})"
        if self.ambiguous:
            return (
                f"{self} (decoded as {decoded_as or self.format}; confidence {self.confidence:.2f}: "
                f"{self.evidence})"
            )
        return f"detected {self.format} (confidence {self.confidence:.2f}: {self.evidence})"


def heads(chunks: Iterable[Chunk], size: int = HEAD_BYTES) -> tuple[bytes, bytes]:
    """The first ``size`` bytes each side sent: ``(c2s, s2c)``."""
    got = {C2S: bytearray(), S2C: bytearray()}
    for _t, direction, data in chunks:
        head = got[direction]
        if len(head) < size:
            head += data[: size - len(head)]
            if len(got[C2S]) >= size and len(got[S2C]) >= size:
                break
    return bytes(got[C2S]), bytes(got[S2C])


def detect_chunks(chunks: Iterable[Chunk], size: int = HEAD_BYTES) -> Detection:
    """:func:`detect` on the :func:`heads` of a capture's chunks."""
    return detect(*heads(chunks, size))


def detect_format(c2s_head: bytes, s2c_head: bytes) -> str | None:
    """The format to decode a connection with (:attr:`Detection.format`), or ``None``: the
    simple form of :func:`detect`."""
    return detect(c2s_head, s2c_head).format


# -- the signatures' view of the heads -------------------------------------------------------


class _Probe:
    """The first bytes of a connection, as the formats' signatures see them
    (:class:`polymux.formats.Probe`)."""

    __slots__ = ("c2s", "heads", "s2c")

    def __init__(self, c2s: bytes, s2c: bytes) -> None:
        self.c2s = c2s
        self.s2c = s2c
        self.heads = {C2S: c2s, S2C: s2c}

    def decode(self, fmt: Format) -> list[FrameRecord] | None:
        """The heads' records under ``fmt``, or None if they break it or hold no whole
        frame."""
        # one_way: the heads are cut short and fed one after the other, so the credit one
        # side grants may come after the data it allows: do not judge flow control here.
        chunks = [(0, d, data) for d, data in self.heads.items() if data]
        records = list(decode_chunks(fmt, chunks, session="detect", one_way=True))
        if any(r.frame_type == "violation" for r in records):
            return None
        if not any(r.frame_type != "truncated" for r in records):
            return None
        return records


def _signatures(handshake: bool) -> list[Signature]:
    """The registered formats' signatures of one kind, in the order they are asked (by
    rank, then in the registry's order; a family's shared signature once)."""
    found: dict[int, tuple[int, int, Signature]] = {}
    for index, fmt in enumerate(FORMATS):
        sig = fmt.signature
        if sig is not None and sig.handshake == handshake and id(sig) not in found:
            found[id(sig)] = (sig.rank, index, sig)
    return [sig for _rank, _index, sig in sorted(found.values(), key=lambda t: t[:2])]


def _fits(probe: _Probe, handshake: bool) -> list[Fit]:
    return [fit for sig in _signatures(handshake) for fit in sig.fits(probe)]


def detect(c2s_head: bytes, s2c_head: bytes) -> Detection:
    """The format of a connection whose client sent ``c2s_head`` first and whose server sent
    ``s2c_head`` (either may be empty), with the candidates, confidence and evidence (see
    the module docstring for the rules)."""
    c2s, s2c = bytes(c2s_head), bytes(s2c_head)
    if not c2s and not s2c:
        return Detection(None, evidence="no bytes")
    probe = _Probe(c2s, s2c)
    fits = _fits(probe, handshake=True)
    if not fits:
        fits = _fits(probe, handshake=False)
    fits = [f for f in fits if f.format in PROTOCOLS]
    if not fits:
        sample = (c2s or s2c)[:8].hex(" ")
        return Detection(None, evidence=f"no format fits the first bytes ({sample} ...)")
    # The most telling fit first (a fixed-layout frame beats a few loose ones); the order
    # above breaks ties.
    fits.sort(key=lambda f: -f.confidence)
    best = fits[0]
    candidates = tuple(dict.fromkeys(f.format for f in fits))
    family = get(best.format).family  # formats sharing one wire (mplex, multiplex)
    ambiguous = (
        len(fits) > 1
        and fits[1].format != best.format
        and get(fits[1].format).family == family
        and (fits[0].confidence == fits[1].confidence)
    )
    # Other formats that fit about as well make it less sure; a much weaker fit does not.
    others = [
        f.format for f in fits[1:] if get(f.format).family != family and f.confidence >= 0.8 * best.confidence
    ]
    confidence = best.confidence * (0.8 ** len(others))
    evidence = best.evidence + (f"; also fits {', '.join(others)}" if others else "")
    return Detection(best.format, candidates, round(confidence, 3), evidence, ambiguous)


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
