"""Which wire format a connection speaks, from the first bytes of each direction: the one
detector of polymux (:func:`polymux.tracing.detect` is this one; ``polymux decode``,
``polymux analyze``, the pipeline, the commands and the sessions' own diagnosis use it).

:func:`detect` looks at the first bytes each side sent (:func:`heads` takes them from a
capture's chunks: the first :data:`HEAD_BYTES` of each direction) and returns a
:class:`Detection`: the format, every format the bytes fit (the candidates, best first),
a confidence and the evidence in words. What tells the formats apart is each registered
format's own signature (:class:`polymux.formats.Signature`, in the format's module):
handshake signatures first (a magic number, a handshake: ``mstream-v1``, ``mstream-v2``,
``streamux``), and only when none fits the frame signatures (``yamux``, ``mstream-v3``,
``omnistreams``, mplex and multiplex, ``smux`` ...). A frame signature decodes the heads
with its format's walk (:func:`decode_heads`), which must give whole frames and no
violation; it gains confidence with the number of frames (a fixed-layout frame counts
most). Other formats that fit about as well lower the confidence; two formats of one family
(mplex and multiplex: one wire, other conventions) that fit equally well make the detection
*ambiguous* (``"ambiguous: mplex or multiplex"``).

Sans-I/O, below the session layer, so that a session's own errors can say what its peer
speaks (:mod:`polymux.session.diagnosis`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from polymux.exceptions import ProtocolError
from polymux.formats.format import Format
from polymux.formats.records import C2S, S2C, Chunk, FrameRecord
from polymux.formats.registry import FORMATS, PROTOCOLS, get
from polymux.formats.signature import Fit, Signature
from polymux.formats.walk import Violation


__all__ = [
    "HEAD_BYTES",
    "Detection",
    "decode_heads",
    "detect",
    "detect_chunks",
    "detect_format",
    "heads",
]

HEAD_BYTES = 4096
"""Bytes of each direction :func:`heads` gives the detector."""


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
        records, violation = decode_heads(fmt, self.heads)
        if violation is not None:
            return None
        if not any(r.frame_type != "truncated" for r in records):
            return None
        return records


class _Heads:
    """The walk's host for :func:`decode_heads` (:class:`polymux.formats.WalkHost`)."""

    session = "detect"
    one_way = True  # the heads are cut short and fed one after the other: credit is not judged

    def __init__(self, fmt: str) -> None:
        self.format = fmt
        self.released: list[str] = []

    def release(self, direction: str) -> None:
        self.released.append(direction)


def decode_heads(fmt: Format, heads: Mapping[str, bytes]) -> tuple[list[FrameRecord], str | None]:
    """The first bytes of each direction (``{"c2s": ..., "s2c": ...}``, either may be
    empty) decoded as ``fmt`` with its codec and walk, one direction after the other: the
    frame records (a ``truncated`` one where a direction ends inside a frame), and the first
    violation's message (``None``: none; the records then stop at it). What detection and
    diagnosis need of a decode: a few KiB at most, so no replay of odd encodings and no
    live path (:class:`polymux.tracing.FrameDecoder` decodes whole captures)."""
    host = _Heads(fmt.name)
    walk = fmt.walk(host)
    codecs = {d: walk.codec(d) for d in heads}
    offsets = dict.fromkeys(heads, 0)
    records: list[FrameRecord] = []

    def feed(direction: str, data: bytes) -> str | None:
        codec = codecs[direction]
        try:
            items = codec.feed(data)
        except ProtocolError as exc:
            return str(exc)
        for item in items:
            try:
                records.extend(walk.records(direction, item, offsets[direction], 0))
            except Violation as exc:
                records.extend(exc.records)
                return str(exc)
            offsets[direction] += walk.size(item)
        return None

    for direction, data in heads.items():
        if not data:
            continue
        problem = feed(direction, bytes(data))
        while problem is None and host.released:
            other = host.released.pop()
            if other in codecs and codecs[other].pending:
                problem = feed(other, b"")
        if problem is not None:
            return records, problem
    for direction, codec in codecs.items():
        if codec.pending:
            what = walk.truncated_detail(direction)
            records.append(
                walk.rec(
                    direction, 0, offsets[direction], "", "truncated", codec.pending,
                    error=f"{fmt.name}: the {direction} stream ends inside a {what} "
                    f"({codec.pending} bytes at offset {offsets[direction]})",
                )
            )  # fmt: skip
    return records, None


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
