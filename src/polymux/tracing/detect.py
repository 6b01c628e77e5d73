"""Which wire format a connection speaks: the one detector ``polymux decode``, ``polymux
analyze``, the pipeline and the CLI use, and the decoding of a flow whose format is not
known.

:func:`detect` looks at the first bytes each side sent (:func:`heads` takes them from a
capture's chunks: the first :data:`HEAD_BYTES` of each direction) and returns a
:class:`Detection`: the format, every format the bytes fit (the candidates, best first),
a confidence and the evidence in words. What tells the formats apart (in this order):

* ``mstream-v1``: the handshake starts with the magic ``2f df 1d 50``.
* ``mstream-v2``: the handshake is msgpack ``[[2, minor], bin(16)]``: ``92 92 02``.
* ``streamux``: a 5-byte initialize message, version 1, reserved bits 0, valid bit
  ranges (and both negotiate, when both are there).
* ``yamux``: 12-byte headers with version 0, a known type and flags; the client's first
  frame opens (SYN) a stream or pings.
* ``mstream-v3``: msgpack array frames, the first an Offer (code 0).
* ``omnistreams``: 4-byte length prefixes, the first message a CREATE_RECEIVE_STREAM or
  CONTROL (spec numbering first, then ``omnistreams-legacy``).
* ``mplex`` / ``multiplex``: varint frames, the first a NEW_STREAM with a small id. The two
  are one wire format; only their conventions differ. NewStream names ``i0``, ``i1`` ...
  (@libp2p/mplex) or equal to the stream id (multiplex sends an empty name then) say
  ``mplex``; a frame over mplex's 1 MiB or a reset carrying a message says ``multiplex``.
  Without such evidence the detection is *ambiguous*: ``"ambiguous: mplex or multiplex"``.

The heads must also decode without a violation under the format. Frame formats gain
confidence with the number of frames that decoded (a magic number or handshake counts
most); other formats that fit too lower it.

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

from polymux import formats
from polymux.exceptions import ProtocolError
from polymux.tracing.decode import decode_chunks
from polymux.tracing.records import C2S, S2C, Chunk, FrameRecord
from polymux.wire import PROTOCOLS, streamux


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

_V1_MAGIC = bytes.fromhex("2fdf1d50")
_MPLEX_MAX = 1024 * 1024


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


# -- the checks ------------------------------------------------------------------------------


def _decode(fmt: str, c2s: bytes, s2c: bytes) -> list[FrameRecord] | None:
    """The heads' records under ``fmt``, or None if they break it or hold no whole frame."""
    # one_way: the heads are cut short and fed one after the other, so the credit one side
    # grants may come after the data it allows: do not judge flow control here.
    chunks = [(0, d, data) for d, data in ((C2S, c2s), (S2C, s2c)) if data]
    records = list(decode_chunks(fmt, chunks, session="detect", one_way=True))
    if any(r.frame_type == "violation" for r in records):
        return None
    if not any(r.frame_type != "truncated" for r in records):
        return None
    return records


def _first(records: list[FrameRecord], direction: str) -> FrameRecord | None:
    for r in records:
        if r.direction == direction:
            return r
    return None


def _starts(
    records: list[FrameRecord], heads: dict[str, bytes], types: tuple[str, ...], answers: tuple[str, ...] = ()
) -> bool:
    """The client's first record is a complete one of ``types``; the server's is one of
    ``types``, one of ``answers`` on a channel the client opened, or cut short by the end
    of its head."""
    for direction, head in heads.items():
        if not head:
            continue
        first = _first(records, direction)
        if first is None:
            return False
        if first.frame_type in types:
            continue
        if direction == S2C and (
            first.frame_type == "truncated" or first.frame_type in answers and first.channel.startswith("c")
        ):
            continue
        return False
    return True


def _small_ids(records: list[FrameRecord]) -> bool:
    """The first channel each side names has a small id (a fresh connection's)."""
    for direction in (C2S, S2C):
        first = _first(records, direction)
        if first is not None and first.channel:
            digits = first.channel.lstrip("cs").split("#")[0]
            if not digits.isdigit() or int(digits) >= 1024:
                return False
    return True


def _session_frame(record: FrameRecord) -> bool:
    """A yamux ping (SYN or ACK) or go-away on stream 0, whole."""
    if record.channel != "" or record.frame_type not in ("ping", "pong", "go_away"):
        return False
    return record.flags in ((0,) if record.frame_type == "go_away" else (1, 2))


def _frames(records: list[FrameRecord]) -> int:
    """Whole frames among ``records`` (one frame may give several records)."""
    return len({(r.direction, r.offset) for r in records if r.frame_type != "truncated"})


def _frame_confidence(frames: int) -> float:
    """A frame format's confidence after ``frames`` frames decoded: 0.5, 0.75 ... 0.97."""
    return min(0.97, 1 - 0.5 ** max(1, frames))


def _sides(present: dict[str, bytes]) -> str:
    return " and ".join(d for d in (C2S, S2C) if present.get(d))


@dataclass
class _Fit:
    """A format the heads fit, how well, and why."""

    format: str
    confidence: float
    evidence: str


def _handshake_fits(heads: dict[str, bytes]) -> list[_Fit]:
    present = {d: h for d, h in heads.items() if h}
    hs = list(present.values())
    fits: list[_Fit] = []
    if all(h[:4] == _V1_MAGIC[: len(h[:4])] for h in hs) and any(len(h) >= 4 for h in hs):
        fits.append(
            _Fit("mstream-v1", 0.99, f"the MultiplexingStream v1 magic 2f df 1d 50 ({_sides(present)})")
        )
    if all(h[:3] == b"\x92\x92\x02"[: len(h[:3])] for h in hs) and any(len(h) >= 3 for h in hs):
        full = all(len(h) >= 6 and h[4:6] == b"\xc4\x10" for h in hs)
        fits.append(
            _Fit(
                "mstream-v2",
                0.99 if full else 0.9,
                f"the MultiplexingStream v2 handshake [[2, minor], bin(16)] ({_sides(present)})",
            )
        )
    if all(h[0] == 1 and len(h) >= streamux.INIT_SIZE for h in hs):
        try:
            inits = [streamux.decode_init(h[: streamux.INIT_SIZE]) for h in hs]
            for init in inits:
                init.check()
            if len(inits) == 2:
                n = streamux.negotiate(*inits)
        except ProtocolError:
            pass
        else:
            if len(inits) == 2:
                fits.append(
                    _Fit(
                        "streamux",
                        0.97,
                        f"Streamux initialize messages both ways, negotiating {n.id_bits}-bit ids "
                        f"and {n.length_bits}-bit lengths",
                    )
                )
            else:
                fits.append(_Fit("streamux", 0.85, f"a Streamux initialize message ({_sides(present)})"))
    return fits


def _frame_fits(heads: dict[str, bytes]) -> list[_Fit]:
    c2s, s2c = heads[C2S], heads[S2C]
    hs = [h for h in (c2s, s2c) if h]
    fits: list[_Fit] = []

    def add(fmt: str, records: list[FrameRecord], what: str) -> None:
        n = _frames(records)
        fits.append(_Fit(fmt, _frame_confidence(n), f"{n} {fmt} frame{'s' * (n != 1)}, {what}"))

    if all(h[0] == 0 for h in hs):
        records = _decode("yamux", c2s, s2c)
        # A client starts by opening a stream or pinging; the server may also answer.
        if (
            records is not None
            and _starts(records, {C2S: c2s}, ("open", "ping"))
            and _starts(records, {S2C: s2c}, ("open", "ping", "open_ack", "pong", "go_away"))
        ):
            first = _first(records, C2S) or _first(records, S2C)
            add("yamux", records, f"the first: {first.frame_type if first else '?'}")
            if first is not None and _session_frame(first):
                # A ping or go-away on stream 0: 8 of its 12 bytes are fixed (version,
                # type, flags, stream id): as telling as a magic number. A yamux server
                # pings at once, and answers bytes it cannot parse with a go-away.
                fits[-1].confidence = max(fits[-1].confidence, 0.95)
                fits[-1].evidence += f" on stream 0 (a yamux {first.frame_type}: 8 of its 12 bytes are fixed)"
    if all(h[0] in (0x93, 0x94) for h in hs):
        records = _decode("mstream-v3", c2s, s2c)
        if records is not None and _starts(records, heads, ("open", "open_ack", "data")):
            add("mstream-v3", records, "msgpack arrays, the first an Offer")
    for fmt, create in (("omnistreams", 1), ("omnistreams-legacy", 0)):
        if all(len(h) < 2 or h[:2] == b"\x00\x00" for h in hs):
            records = _decode(fmt, c2s, s2c)
            if records is not None and _starts(records, heads, ("open", "control", "window_update")):
                add(fmt, records, "length-prefixed messages, the first a CREATE_RECEIVE_STREAM or CONTROL")
            # A first message longer than the head (creation metadata): its length prefix
            # and type byte, with the stream id 0 the first stream gets.
            elif (
                len(c2s) >= 6
                and 0 < int.from_bytes(c2s[:4], "big") <= 1 << 24
                and c2s[4:6] == bytes((create, 0))
            ):
                fits.append(
                    _Fit(
                        fmt,
                        0.5,
                        "a length prefix and a CREATE_RECEIVE_STREAM for stream 0 (longer than the head)",
                    )
                )
    fits.extend(_mplex_fits(heads))
    fits.extend(_registry_fits(c2s, s2c))
    return fits


def _registry_fits(c2s: bytes, s2c: bytes) -> list[_Fit]:
    """Formats whose codec module offers a ``signature`` hook (:mod:`polymux.formats`)."""
    fits = []
    for fmt in formats.FORMATS:
        if fmt.trace is not None:
            continue  # the formats above, whose rules this module knows
        found = fmt.codec().signature(fmt.name, c2s, s2c)  # a generic-trace entry's hook
        if found is not None:
            fits.append(_Fit(fmt.name, found[0], found[1]))
    return fits


def _mplex_fits(heads: dict[str, bytes]) -> list[_Fit]:
    """mplex and multiplex (one wire): both fit, and the evidence decides their order."""
    c2s, s2c = heads[C2S], heads[S2C]
    strict = _decode("mplex", c2s, s2c)
    records = strict if strict is not None else _decode("multiplex", c2s, s2c)
    if records is None or not _starts(records, heads, ("open",), ("data", "end", "reset")):
        return []
    if not _small_ids(records) or _reopens(heads):
        return []
    n = _frames(records)
    conf = _frame_confidence(n)
    base = f"{n} mplex/multiplex frame{'s' * (n != 1)}, the first a NewStream"
    if strict is None:
        return [_Fit("multiplex", conf, f"{base}; a frame longer than mplex's 1 MiB")]
    says_mplex, says_multiplex = _mplex_dialect(heads)
    if says_mplex and not says_multiplex:
        return [
            _Fit("mplex", conf, f"{base}; {says_mplex}"),
            _Fit("multiplex", conf / 2, "the same wire as mplex"),
        ]
    if says_multiplex and not says_mplex:
        return [
            _Fit("multiplex", conf, f"{base}; {says_multiplex}"),
            _Fit("mplex", conf / 2, "the same wire as multiplex"),
        ]
    why = "nothing in the first bytes tells the two apart"
    if says_mplex and says_multiplex:
        why = f"contradicting hints ({says_mplex}; {says_multiplex})"
    return [
        _Fit("mplex", conf, f"{base}; {why}"),
        _Fit("multiplex", conf, f"{base}; {why}"),
    ]


def _reopens(heads: dict[str, bytes]) -> bool:
    """A NewStream for an id its sender already has open: what no mplex or multiplex peer
    sends (their sessions end on it), and what other formats' bytes read as mplex often
    look like (a yamux ping is four NewStreams of stream 0)."""
    from polymux.wire import mplex

    for head in heads.values():
        try:
            frames = mplex.Decoder(16 * 1024 * 1024, "multiplex").feed(head)
        except ProtocolError:
            continue
        opened: set[int] = set()
        for f in frames:
            if f.flag == 0:
                if f.stream_id in opened:
                    return True
                opened.add(f.stream_id)
            elif f.flag in (4, 6):  # the initiator closes or resets its own stream
                opened.discard(f.stream_id)
    return False


def _mplex_dialect(heads: dict[str, bytes]) -> tuple[str, str]:
    """Hints in the frames themselves: (what says mplex, what says multiplex), "" for none."""
    from polymux.wire import mplex

    names: list[tuple[int, bytes]] = []
    reset_texts = 0
    for head in heads.values():
        if not head:
            continue
        try:
            frames = mplex.Decoder(16 * 1024 * 1024, "multiplex").feed(head)
        except ProtocolError:
            continue
        for f in frames:
            body = bytes(f.body)
            if f.flag == 0:
                names.append((f.stream_id, body))
            elif f.flag >= 5 and body:
                reset_texts += 1
    says_mplex = ""
    if names and all(body == b"i%d" % sid for sid, body in names):
        says_mplex = f"NewStream names {', '.join(b.decode() for _s, b in names[:3])} (@libp2p/mplex's i<id>)"
    elif names and all(body == b"%d" % sid for sid, body in names):
        says_mplex = "NewStream names that equal the stream id (multiplex sends none then)"
    says_multiplex = f"a reset carrying a message ({reset_texts})" if reset_texts else ""
    return says_mplex, says_multiplex


def detect(c2s_head: bytes, s2c_head: bytes) -> Detection:
    """The format of a connection whose client sent ``c2s_head`` first and whose server sent
    ``s2c_head`` (either may be empty), with the candidates, confidence and evidence (see
    the module docstring for the rules)."""
    c2s, s2c = bytes(c2s_head), bytes(s2c_head)
    heads = {C2S: c2s, S2C: s2c}
    if not c2s and not s2c:
        return Detection(None, evidence="no bytes")
    fits = _handshake_fits(heads)
    if not fits:
        fits = _frame_fits(heads)
    fits = [f for f in fits if f.format in PROTOCOLS]
    if not fits:
        sample = (c2s or s2c)[:8].hex(" ")
        return Detection(None, evidence=f"no format fits the first bytes ({sample} ...)")
    # The most telling fit first (a fixed-layout frame beats a few loose ones); the order
    # above breaks ties.
    fits.sort(key=lambda f: -f.confidence)
    best = fits[0]
    candidates = tuple(dict.fromkeys(f.format for f in fits))
    family = formats.get(best.format).family  # formats sharing one wire (mplex, multiplex)
    ambiguous = (
        len(fits) > 1
        and fits[1].format != best.format
        and formats.get(fits[1].format).family == family
        and (fits[0].confidence == fits[1].confidence)
    )
    # Other formats that fit about as well make it less sure; a much weaker fit does not.
    others = [
        f.format
        for f in fits[1:]
        if formats.get(f.format).family != family and f.confidence >= 0.8 * best.confidence
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
