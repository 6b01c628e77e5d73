"""Why there is no session with a peer, in words: what it sent, how sure we are of what it
speaks, and what to try. Sessions say it in their own errors (:func:`describe_end`: the
:class:`~polymux.exceptions.SessionClosed` a session ends with, when the peer never spoke
its format), and the commands (``polymux connect``, ``serve``, ``chat``, ``send``) from the
bytes they keep; :func:`polymux.tracing.diagnose` is :func:`diagnose`.

:func:`diagnose` looks at the first bytes the peer sent (``received``) and, in order:

* nothing: says so, and whether the peer closed the connection, reset it or just stayed
  silent (or we closed it first);
* HTTP, TLS, SSH (:func:`polymux.sniff.identify`): names them (near certain: many fixed
  bytes);
* a line of text: says so, without naming a multiplexing format (they are all binary);
* another multiplexing format, named only at :data:`NAME_CONFIDENCE` or above
  (:func:`polymux.formats.detect.detect`: a magic number, a handshake, a yamux frame on
  stream 0, three frames or more); mplex and multiplex are one wire and are named together;
* otherwise, what was seen and that it fits no format polymux can name with confidence
  (with the best guess and its confidence, below the bar).

It returns None when the bytes are of the expected format (the failure is not a missing
session) unless told that the session itself found them wrong (``mismatch``). Where a peer
of another version of the format (smux and smux-v2) would close without a word, the advice
names that version too (:attr:`polymux.formats.Format.versions`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polymux.exceptions import FormatMismatch, ProtocolError, SessionClosed
from polymux.formats.detect import Detection, decode_heads, detect
from polymux.formats.records import C2S, S2C
from polymux.formats.registry import get as get_format
from polymux.sniff import identify, show


if TYPE_CHECKING:  # typing only: the core calls this module, not the other way
    from polymux.session.core import SessionCore


__all__ = [
    "API_OPTION",
    "NAME_CONFIDENCE",
    "Diagnosis",
    "describe_end",
    "diagnose",
    "handshake_timed_out",
    "name_the_peer",
]

NAME_CONFIDENCE = 0.85
"""The least confidence at which a diagnosis names the format the peer speaks."""

API_OPTION = "protocol={!r}"
"""How the library's own errors spell a format in their advice (the commands say
``--protocol yamux``)."""


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
    return get_format(protocol).family


def _text(data: bytes) -> bool:
    """A line of text (what no multiplexing format starts with)."""
    line = data[:64].split(b"\n")[0].rstrip(b"\r")
    return len(line) >= 4 and all(32 <= b < 127 or b == 9 for b in line)


def _violation(protocol: str, data: bytes) -> str | None:
    """The first violation of ``protocol`` in the peer's first bytes, or None."""
    records, violation = decode_heads(get_format(protocol), {S2C: data})
    if violation is not None:
        return violation
    for record in records:  # a walk's own verdict on a whole frame
        if record.frame_type == "violation":
            return record.error or "a violation"
    return None


def _others(protocol: str) -> str:
    """The peers of another format that close without a word, in words: any other format,
    and the other versions of this one by name."""
    versions = get_format(protocol).versions
    return "another format" + (f" or of another version of it ({', '.join(versions)})" if versions else "")


def diagnose(
    protocol: str,
    received: bytes,
    *,
    closed: bool = True,
    waited: float | None = None,
    mismatch: bool = False,
    peer_role: str = "peer",
    reset: bool = False,
    local: bool = False,
    option: str = "--protocol {}",
    detect_formats: bool = True,
) -> Diagnosis | None:
    """Why a ``protocol`` session with a peer that sent ``received`` (its first bytes; the
    more the better, a few hundred are plenty) did not come about.

    Args:
        protocol: the format we spoke.
        received: the peer's first bytes.
        closed: the peer closed the connection; else it stayed silent, for ``waited``
            seconds when given.
        waited: how long a silent peer was waited for.
        mismatch: the session found the bytes wrong itself (it failed with
            :class:`~polymux.exceptions.FormatMismatch`): a diagnosis even if they look fine here.
        peer_role: how to call the peer in sentences (``"server"``, ``"client"``); a
            ``"client"``'s bytes are judged as a client's (who speaks first differs).
        reset: the connection was reset (or broke) rather than closed.
        local: we closed the connection, the peer having said nothing.
        option: how the advice spells a format (``"--protocol {}"``, the commands'; the
            library's errors say ``protocol='yamux'``: :data:`API_OPTION`).
        detect_formats: try to name another multiplexing format (a detection over every registered
            format, about a millisecond); ``False``: HTTP, TLS, SSH and text only (what a
            server's sessions do for the connections that never spoke: a scanner's junk must
            not cost it that much).

    Returns:
        The diagnosis, or None when ``received`` fits ``protocol`` and ``mismatch`` is false.
    """
    received = bytes(received)
    who = f"the {peer_role}"
    if not received:
        if local:
            seen = f"{who} sent nothing before we closed the connection"
        elif reset:
            seen = f"{who} reset the connection without sending a byte"
        elif closed:
            seen = f"{who} closed the connection without sending a byte"
        else:
            seen = f"{who} sent nothing" + (f" in {waited:g} s" if waited is not None else "")
        return Diagnosis(
            protocol,
            seen,
            None,
            0.0,
            f"check that it speaks {protocol} (a peer of {_others(protocol)}, or one that refuses us, "
            "often closes without a word)"
            if (closed or reset) and not local
            else f"check that it speaks {protocol} (a peer of {_others(protocol)} may wait for bytes it "
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
    detection = (
        Detection(None)
        if not detect_formats
        else detect(received, b"")
        if peer_role == "client"
        else detect(b"", received)
    )
    other = detection.format is not None and _family(detection.format) != _family(protocol)
    advice = "run both sides with the same format ({})"
    if other and detection.confidence >= NAME_CONFIDENCE:
        assert detection.format is not None
        if detection.ambiguous:
            name = " or ".join(detection.candidates[:2])
            hint = advice.format(" or ".join(option.format(c) for c in detection.candidates[:2]))
        else:
            name, hint = detection.format, advice.format(option.format(detection.format))
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


# -- the session's own errors --------------------------------------------------------------------


def _role(core: SessionCore) -> str:
    """How the errors call the peer: a client's peer is the server."""
    if core.is_client is None:
        return "peer"
    return "server" if core.is_client else "client"


def _spoke(core: SessionCore) -> bool:
    """Whether the peer sent a whole frame (or handshake message) of the format. The core's
    liveness says so for a read that gave events or output, but output queued before the
    read counts there too (a yamux client's first ping): when all the peer ever sent is
    kept, its bytes are decoded here, as its side."""
    if not core.liveness.heard:
        return False
    first = core._peer_first
    if core._peer_received > len(first):
        return True  # more than the few bytes kept: it spoke, as far as can be told
    side = C2S if core.is_client is False else S2C
    records, violation = decode_heads(get_format(core.format), {side: first})
    return violation is None and any(r.frame_type not in ("truncated", "violation") for r in records)


def name_the_peer(fmt: str, first: bytes, *, peer_role: str = "peer") -> Diagnosis | None:
    """The diagnosis of bytes that broke ``fmt`` from the start, when it names what the peer
    speaks (another multiplexing format, at :data:`NAME_CONFIDENCE` or above), else None:
    what :func:`polymux.session.peer.mismatch` adds to a :class:`FormatMismatch`. Only a
    client's sessions try (``peer_role="server"``): the user chose that peer, while a
    server's junk connections must stay cheap."""
    found = diagnose(
        fmt,
        first,
        mismatch=True,
        peer_role=peer_role,
        option=API_OPTION,
        detect_formats=peer_role == "server",
    )
    return found if found is not None and found.peer is not None else None


def describe_end(core: SessionCore, error: SessionClosed, exc: BaseException | None) -> None:
    """Say how ``core``'s connection ended on ``error`` (the :class:`SessionClosed` its
    channels get; ``exc``: what the transport reported), and, when the peer never spoke
    the format, why: :attr:`SessionClosed.ending`, :attr:`~SessionClosed.first_bytes` and
    :attr:`~SessionClosed.diagnosis`, with the diagnosis in the message. The error the
    session failed with first (``core.error``: a deadline's) says the same, so every
    error chained to it does. Nothing is said of a peer that spoke the format."""
    fmt = core.format
    failure = core.error
    if isinstance(failure, ProtocolError):
        ending = SessionClosed.VIOLATION
    elif isinstance(failure, SessionClosed) and failure._ending is not None:
        ending = failure._ending
    elif exc is not None:
        ending = SessionClosed.RESET
    elif core.peer_closed:
        ending = SessionClosed.CLOSED
    else:
        ending = SessionClosed.LOCAL
    first = core._peer_first
    heard = _spoke(core)
    diagnosis: str | None = None
    if not heard:
        role = _role(core)
        named = core.is_client is True  # a server's junk connections stay cheap (see diagnose)

        def say(
            received: bytes,
            *,
            closed: bool = True,
            reset: bool = False,
            local: bool = False,
            mismatch: bool = False,
        ) -> Diagnosis | None:
            return diagnose(
                fmt,
                received,
                closed=closed,
                reset=reset,
                local=local,
                mismatch=mismatch,
                peer_role=role,
                option=API_OPTION,
                detect_formats=named,
            )

        found: Diagnosis | None = None
        if isinstance(failure, FormatMismatch):
            diagnosis = failure.diagnosis  # the session's own verdict on the bytes, in its message
        elif isinstance(failure, ProtocolError):
            if first:  # a precise early error (a failed negotiation): what do the bytes say?
                found = say(first, mismatch=True)
        elif ending == SessionClosed.CLOSED:
            found = say(first)
        elif ending == SessionClosed.RESET:
            # Reset inside its first frame: as a close there would be (a violation).
            found = say(first, reset=True, mismatch=bool(first))
        elif ending == SessionClosed.VANISHED:
            found = say(first, closed=False)
        elif ending == SessionClosed.LOCAL and not first and core.liveness.bytes_out:
            found = say(b"", local=True)
        if found is not None:
            diagnosis = str(found)
    _mark(error, ending, first, diagnosis)
    if isinstance(failure, ProtocolError) and not isinstance(failure, FormatMismatch) and diagnosis:
        # A precise early error (a failed negotiation) from a peer of another format: say so.
        failure.args = (f"{failure}; {diagnosis}",)
        failure.diagnosis = diagnosis
        failure.first_bytes = first
        error.args = (f"{fmt}: session ended: {failure}",)
    if isinstance(failure, SessionClosed):
        if failure._diagnosis is None and diagnosis is not None and ending == SessionClosed.VANISHED:
            failure.args = (f"{failure}: {diagnosis}",)
        _mark(failure, ending, first, diagnosis)
        error.args = (f"{fmt}: session ended: {failure}",)
    elif failure is None and diagnosis is not None:
        error.args = (f"{error}: {diagnosis}",)


def handshake_timed_out(core: SessionCore, timeout: float) -> SessionClosed:
    """The error of a handshake that did not finish within ``timeout`` seconds (the drivers'
    own wait for it), saying what the peer sent, if anything, and what that suggests."""
    first = core._peer_first
    found = None
    if not core.liveness.heard:
        found = diagnose(
            core.format,
            first,
            closed=False,
            waited=timeout,
            peer_role=_role(core),
            option=API_OPTION,
            detect_formats=core.is_client is True,
        )
    diagnosis = None if found is None else str(found)
    message = f"{core.format}: no handshake from the peer within {timeout:g} s"
    return SessionClosed(
        message + (f": {diagnosis}" if diagnosis else ""),
        ending=SessionClosed.VANISHED,
        first_bytes=first,
        diagnosis=diagnosis,
    )


def _mark(error: SessionClosed, ending: str, first: bytes, diagnosis: str | None) -> None:
    if error._ending is None:
        error._ending = ending
    if error._first_bytes is None:
        error._first_bytes = first
    if error._diagnosis is None:
        error._diagnosis = diagnosis
