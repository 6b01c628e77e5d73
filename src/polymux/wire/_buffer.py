"""The split-frame buffer every incremental decoder of :mod:`polymux.wire` shares.

A read from a byte stream ends anywhere, most often inside a frame. A decoder parses the
whole frames of a read in place (their bodies are views of it, no copy) and hands the rest
to its :class:`FrameBuffer`. On the next read, :meth:`FrameBuffer.complete` finishes that
one frame by copying just the bytes it still needs, and the decoder goes on parsing in
place after them. So a decoder holds at most one incomplete frame, and only a frame that
straddles two reads is ever copied.

:meth:`FrameBuffer.walk` tells where whole frames end without decoding them: a driver that
processes a read a part at a time (input slicing, :mod:`polymux.session.slicing`) cuts it
at frame ends, so no frame is split (and copied) by the cut.
"""

from __future__ import annotations

from collections.abc import Callable

from polymux._types import BytesLike
from polymux.exceptions import ProtocolError


__all__ = ["INCOMPLETE", "LARGE_FRAME", "FrameBuffer", "Incomplete"]


class Incomplete(Exception):
    """A header parser reached the end of its bytes: it needs more."""


INCOMPLETE = Incomplete()
"""The one instance header parsers raise (no allocation per split frame). It is shared, so
whoever catches it must drop its ``__traceback__``: every raise appends to it, and the
chain would keep the frames (and the buffers they hold) alive forever."""


LARGE_FRAME = 128 * 1024
"""A frame held back that is larger than this is kept as the pieces its reads brought and
joined once, when whole (one copy); a smaller one grows in one buffer (two copies, of few
bytes)."""


class FrameBuffer:
    """Holds the start of the frame a read cut off, and completes it on the next read.

    Args:
        probe: bytes enough to read the longest header of the format (the size of a frame
            is known once that many bytes are in, or the frame's end is).
    """

    __slots__ = ("_need", "_pieces", "_probe", "_size", "held")

    def __init__(self, probe: int) -> None:
        self.held = bytearray()
        """The start of the frame held back (read-only: a decoder tests it before each feed,
        an attribute because that is cheaper than a property on the hot path)."""
        self._pieces: list[BytesLike] = []  # a large frame's later pieces (see _keep)
        self._size = 0  # bytes held in all
        self._need = 0  # the held frame's whole size once its header is in (0: not yet)
        self._probe = probe

    @property
    def pending(self) -> int:
        """Bytes held back (the start of one frame)."""
        return self._size

    def head(self, n: int) -> bytes | None:
        """The first ``n`` held bytes (a header), or None while fewer are held."""
        return bytes(self.held[:n]) if len(self.held) >= n else None

    def hold(self, rest: BytesLike, need: int = 0) -> None:
        """Keep ``rest``: the start of a frame of ``need`` bytes in all (0: not known yet)."""
        self._need = need
        probe = self._probe
        if need > LARGE_FRAME and len(rest) > probe:
            self.held += rest[:probe]  # the header, where head() reads it
            self._size += probe
            self._keep(rest[probe:])
            return
        self.held += rest
        self._size += len(rest)

    def _keep(self, piece: BytesLike) -> None:
        """More of a large frame: a piece of at least a fifth of an immutable read is kept
        as it is (no copy: the frame is joined once, when it is whole), a smaller one is
        copied (a view would pin a whole read for a few bytes)."""
        obj = piece.obj if piece.__class__ is memoryview else piece
        if obj.__class__ is not bytes or len(piece) * 5 < len(obj):
            piece = bytes(piece)
        self._pieces.append(piece)
        self._size += len(piece)

    def take(self) -> bytes:
        """Return everything held, and hold nothing more."""
        held = b"".join([self.held, *self._pieces]) if self._pieces else bytes(self.held)
        self.held.clear()
        self._pieces.clear()
        self._size = 0
        self._need = 0
        return held

    def resume(self, data: BytesLike, frame_size: Callable[[bytes], int]) -> tuple[bytes | None, int]:
        """Complete the held frame with the start of ``data`` (a decoder calls this when it
        holds something, or when its first item is special: a handshake).

        ``frame_size(probe)`` reads a header at the start of ``probe`` and returns the size
        of its whole frame (header included), raises :data:`INCOMPLETE` when ``probe`` is
        too short to tell, or raises the format's ``ProtocolError`` for a bad header.

        Returns ``(frame, pos)``: the frame, now whole (a copy), and where parsing goes on
        in ``data``; or ``(None, len(data))`` when ``data`` did not finish it (it is all
        held: parsing ``data`` from ``pos`` finds nothing more). A frame larger than
        :data:`LARGE_FRAME` is copied once, when it is whole (its pieces are kept as the
        reads brought them until then); a smaller one grows in one buffer.
        """
        held = self.held
        have = self._size
        need = self._need
        if not need:
            probe = self._probe
            try:
                need = frame_size(bytes(held[:probe]) + data[:probe])
            except Incomplete as incomplete:
                incomplete.__traceback__ = None  # shared: see INCOMPLETE
                held += data
                self._size += len(data)
                return None, len(data)
        # Held bytes are always a frame's incomplete start, and the probe covers any header,
        # so the frame is longer than what is held: ``used`` is positive.
        used = need - have
        end = len(data)
        if used > end:
            self._need = need
            if self._pieces or need > LARGE_FRAME:
                rest: BytesLike = data
                if len(held) < self._probe:  # (the header first, where head() reads it)
                    k = self._probe - len(held)
                    held += data[:k]
                    self._size += min(k, end)
                    rest = data[k:]
                if rest:
                    self._keep(rest)
            else:
                held += data
                self._size += end
            return None, end
        if self._pieces:
            frame = b"".join([held, *self._pieces, data[:used]])
            self._pieces.clear()
        else:
            held += data[:used]
            frame = bytes(held)
        held.clear()
        self._size = 0
        self._need = 0
        return frame, used

    def walk(self, data: BytesLike, start: int, most: int, frame_size: Callable[[bytes], int]) -> int:
        """Where the first ``most`` frames of ``data`` from ``start`` end, read from their
        headers alone (``frame_size`` as for :meth:`resume`).

        ``data`` from ``start`` is what follows the bytes fed so far: while the start of a
        frame is held, its rest comes first (it counts as one of the ``most``; ``start`` is
        returned while its size is not known yet). A frame that runs past the end of
        ``data`` (or whose header does) ends the walk at ``len(data)``: that is all there is
        of it. A header ``frame_size`` refuses ends it where that frame starts (decoding
        the bytes reports the error).
        """
        end = len(data)
        pos = start
        if self.held:
            if not self._need:
                return start
            pos += self._need - self._size
            most -= 1
            if pos >= end:
                return end
        probe = self._probe
        for _ in range(most):
            if pos >= end:
                break
            try:
                size = frame_size(bytes(data[pos : pos + probe]))
            except Incomplete as incomplete:
                incomplete.__traceback__ = None  # shared: see INCOMPLETE
                return end
            except ProtocolError:
                break
            if pos + size >= end:
                return end
            pos += size
        return pos
