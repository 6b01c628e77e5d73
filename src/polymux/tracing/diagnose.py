"""Why there is no session with a peer: what it sent, how sure we are of what it speaks,
and what to try. The commands (``polymux connect``, ``serve``, the examples) say this when a
session fails before the peer ever spoke its format.

:func:`diagnose` looks at the first bytes the peer sent (``received``) and, in order:

* nothing: says so, and whether the peer closed the connection or just stayed silent;
* HTTP, TLS, SSH (:func:`polymux.sniff.identify`): names them (near certain: many fixed
  bytes);
* a line of text: says so, without naming a multiplexing format (they are all binary);
* another multiplexing format, named only at :data:`NAME_CONFIDENCE` or above
  (:func:`polymux.tracing.detect`: a magic number, a handshake, a yamux frame on stream 0,
  three frames or more); mplex and multiplex are one wire and are named together;
* otherwise, what was seen and that it fits no format polymux can name with confidence
  (with the best guess and its confidence, below the bar).

It returns None when the bytes are of the expected format (the failure is not a missing
session) unless told that the session itself found them wrong (``mismatch``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from polymux import formats
from polymux.sniff import identify, show
from polymux.tracing.decode import decode_chunks
from polymux.tracing.detect import detect
from polymux.tracing.records import S2C


__all__ = ["NAME_CONFIDENCE", "Diagnosis", "diagnose"]

NAME_CONFIDENCE = 0.85
"""The least confidence at which a diagnosis names the format the peer speaks."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What the peer sent instead of a session (:func:`diagnose`)."""

    protocol: str
    """The format we spoke."""
    seen: str
    """What was seen, in words."""
    peer: str | None
    """What the peer speaks, when it can be named (``"yamux"``, ``"HTTP"``, ``"mplex or
    multiplex"``); None below :data:`NAME_CONFIDENCE`."""
    confidence: float
    """How sure :attr:`peer` is (0 when nothing is named)."""
    advice: str
    """What to try."""

    def __str__(self) -> str:
        if self.peer is None:
            return f"{self.seen}; {self.advice}"
        sure = "certain" if self.confidence >= 0.99 else f"confidence {self.confidence:.2f}"
        return f"the peer speaks {self.peer}, not {self.protocol} ({sure}: {self.seen}); {self.advice}"


def _family(protocol: str) -> str:
    return formats.get(protocol).family


def _text(data: bytes) -> bool:
    """A line of text (what no multiplexing format starts with)."""
    line = data[:64].split(b"\n")[0].rstrip(b"\r")
    return len(line) >= 4 and all(32 <= b < 127 or b == 9 for b in line)


def _violation(protocol: str, data: bytes) -> str | None:
    """The first violation of ``protocol`` in the peer's first bytes, or None."""
    for record in decode_chunks(protocol, [(0, S2C, data)], session="diagnose", one_way=True):
        if record.frame_type == "violation":
            return record.error or "a violation"
    return None


def diagnose(
    protocol: str,
    received: bytes,
    *,
    closed: bool = True,
    waited: float | None = None,
    mismatch: bool = False,
    peer_role: str = "peer",
) -> Diagnosis | None:
    """Why a ``protocol`` session with a peer that sent ``received`` (its first bytes; the
    more the better, a few hundred are plenty) did not come about.

    Args:
        protocol: the format we spoke.
        received: the peer's first bytes.
        closed: the peer closed (or reset) the connection; else it stayed silent, for
            ``waited`` seconds when given.
        mismatch: the session found the bytes wrong itself (it failed with
            :class:`~polymux.exceptions.FormatMismatch`): a diagnosis even if they look fine here.
        peer_role: how to call the peer in sentences (``"server"``, ``"client"``); a
            ``"client"``'s bytes are judged as a client's (who speaks first differs).

    Returns:
        The diagnosis, or None when ``received`` fits ``protocol`` and ``mismatch`` is false.
    """
    received = bytes(received)
    who = f"the {peer_role}"
    if not received:
        if closed:
            seen = f"{who} closed the connection without sending a byte"
        else:
            seen = f"{who} sent nothing" + (f" in {waited:g} s" if waited is not None else "")
        return Diagnosis(
            protocol,
            seen,
            None,
            0.0,
            f"check that it speaks {protocol} (a peer of another format, or one that refuses us, "
            "often closes without a word)"
            if closed
            else f"check that it speaks {protocol} (a peer of another format may wait for bytes it "
            "understands)",
        )
    foreign = identify(received)
    if foreign is not None:
        return Diagnosis(
            protocol, f"it sent {foreign.what}, so it is {foreign.peer}", foreign.name, 0.99, foreign.advice
        )
    if _text(received):
        return Diagnosis(
            protocol,
            f"{who} answered with text, {show(received)}, which is not {protocol} (nor any multiplexing "
            "format: they are binary)",
            None,
            0.0,
            "check what listens there",
        )
    # The detector knows who speaks first in each format: give it the bytes as the side
    # the peer is on.
    detection = detect(received, b"") if peer_role == "client" else detect(b"", received)
    other = detection.format is not None and _family(detection.format) != _family(protocol)
    advice = "run both sides with the same format (--protocol {})"
    if other and detection.confidence >= NAME_CONFIDENCE:
        assert detection.format is not None
        if detection.ambiguous:
            name = " or ".join(detection.candidates[:2])
            hint = advice.format(" or --protocol ".join(detection.candidates[:2]))
        else:
            name, hint = detection.format, advice.format(detection.format)
        evidence = re.sub(r" \((?:c2s|s2c)(?: and (?:c2s|s2c))?\)", "", detection.evidence)
        return Diagnosis(protocol, evidence, name, detection.confidence, hint)
    violation = _violation(protocol, received)
    if violation is None and not mismatch:
        return None  # they are ours: whatever failed came later
    seen = f"{who}'s first bytes ({show(received)}) are not {protocol}"
    if violation is not None:
        seen += f" ({violation})"
    if other:
        return Diagnosis(
            protocol,
            seen,
            None,
            0.0,
            f"they fit no format polymux can name with confidence (at best {detection.format}, "
            f"confidence {detection.confidence:.2f}, below {NAME_CONFIDENCE}); check which format it speaks",
        )
    return Diagnosis(
        protocol, seen, None, 0.0, "they fit no format polymux knows; check which protocol it speaks"
    )
