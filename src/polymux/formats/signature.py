"""What a format's detection signature is made of.

A :class:`Signature` says how well the first bytes of each direction of a connection (a
:class:`Probe`) fit its format, as :class:`Fit` values with a confidence and the evidence
in words. The detector (:func:`polymux.tracing.detect`) asks every registered format's
signature, handshake signatures first (a magic number, a handshake: when one fits, frame
signatures are not asked), and keeps the most telling fit; the helpers below judge the
records a probe decodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from polymux.formats.records import C2S, S2C, FrameRecord


if TYPE_CHECKING:
    from polymux.formats.format import Format


__all__ = [
    "Fit",
    "Probe",
    "Signature",
    "first",
    "frame_confidence",
    "frames",
    "sides",
    "starts",
]


@dataclass
class Fit:
    """A format the first bytes fit, how well, and why."""

    format: str
    """The format's name."""
    confidence: float
    """0 to 1 (a magic number or handshake that only this format has is near 1)."""
    evidence: str
    """Why, in words."""


class Probe(Protocol):
    """The first bytes of a connection, as a signature sees them."""

    c2s: bytes
    """The first bytes the client sent (may be empty)."""
    s2c: bytes
    """The first bytes the server sent (may be empty)."""
    heads: dict[str, bytes]
    """Both, by direction (``{"c2s": ..., "s2c": ...}``)."""

    def decode(self, fmt: Format) -> list[FrameRecord] | None:
        """The records of the heads decoded as ``fmt`` (credit not judged: the heads are
        cut short), or ``None`` if they break it or hold no whole frame."""


@dataclass(frozen=True)
class Signature:
    """How the first bytes of a connection tell a format (or a family of formats that
    share one wire, such as mplex and multiplex: one signature names both)."""

    fits: Callable[[Probe], list[Fit]]
    """The formats the probe fits, with confidence and evidence (none: ``[]``)."""
    handshake: bool = False
    """The signature reads a handshake or magic number: asked first, and when one such
    signature fits, frame signatures are not asked."""
    rank: int = 100
    """Order among signatures of the same kind (lower first); fits of equal confidence
    keep this order."""


def first(records: list[FrameRecord], direction: str) -> FrameRecord | None:
    """The first record of ``direction`` (polymux's heartbeats apart: a session may send
    one before its first frame)."""
    for r in records:
        if r.direction == direction and r.frame_type != "heartbeat":
            return r
    return None


def starts(
    records: list[FrameRecord], heads: dict[str, bytes], types: tuple[str, ...], answers: tuple[str, ...] = ()
) -> bool:
    """The client's first record is a complete one of ``types``; the server's is one of
    ``types``, one of ``answers`` on a channel the client opened, or cut short by the end
    of its head."""
    for direction, head in heads.items():
        if not head:
            continue
        found = first(records, direction)
        if found is None:
            return False
        if found.frame_type in types:
            continue
        if direction == S2C and (
            found.frame_type == "truncated" or found.frame_type in answers and found.channel.startswith("c")
        ):
            continue
        return False
    return True


def frames(records: list[FrameRecord]) -> int:
    """Whole frames among ``records`` (one frame may give several records)."""
    return len({(r.direction, r.offset) for r in records if r.frame_type != "truncated"})


def frame_confidence(count: int) -> float:
    """A frame format's confidence after ``count`` frames decoded: 0.5, 0.75 ... 0.97."""
    return min(0.97, 1 - 0.5 ** max(1, count))


def sides(present: dict[str, bytes]) -> str:
    """Which directions sent something, in words (``"c2s and s2c"``)."""
    return " and ".join(d for d in (C2S, S2C) if present.get(d))
