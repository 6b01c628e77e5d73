"""How much of one connection's input a driver processes per loop turn.

A read of tiny frames (a flood, or a peer's many small messages) costs up to half a
millisecond per KiB, and a socket read is up to 256 KiB: processed whole, one connection's
read would hold every other connection of the loop for a tenth of a second or more. So a
read that took over :data:`TURN` puts the session's input in slices of :data:`SLICE` bytes
for the next :data:`SLICED_FOR` seconds, as many per loop turn as fit in :data:`TURN`, the
rest on the next turn (the socket is not read meanwhile). Reads of large frames take
microseconds and are processed whole.

A slice ends where a frame ends: it reaches to the end of its first :data:`SLICE_FRAMES`
frames when they run past :data:`SLICE` bytes (the engine reads their sizes from the
headers, ``Engine.whole_frames``). Large frames cost per frame,
not per byte, so a slice of a few large frames is as cheap as one of small ones, and no
frame is cut in two (and copied) by a slice: a session of 64 KiB frames in sliced mode
processes a read in one slice, as a whole read (in 16 KiB slices it lost half its
throughput, and an honest burst of opens put it there for a second).

The driver keeps the clock (``time.perf_counter``) and the loop turns, and checks the
policy inline on every read (it is the hot path): a read larger than :data:`SLICE` before
:attr:`InputSlicer.until` goes in slices (:meth:`InputSlicer.hold`); work on a read (or a
turn of slices) that took over :data:`TURN` since ``start`` sets ``until`` to
``start + SLICED_FOR``.
"""

from __future__ import annotations

from collections.abc import Callable


__all__ = ["DENSE_FLOOR", "FULL_READ", "SLICE", "SLICED_FOR", "SLICE_FRAMES", "TURN", "InputSlicer", "dense"]

SLICE = 16 * 1024
"""Bytes of input processed at a time while a session is in sliced mode."""

SLICE_FRAMES = 16
"""Frames a slice may reach to the end of past :data:`SLICE` bytes (the work of a slice is
at most that many frames, or :data:`SLICE` bytes of frames)."""

TURN = 0.005
"""Seconds of work on one read (or per loop turn, in sliced mode) before slicing."""

SLICED_FOR = 1.0
"""Seconds a session stays in sliced mode after dense input (:func:`dense`)."""

FULL_READ = 256 * 1024
"""The largest socket read (asyncio's and uvloop's)."""


DENSE_FLOOR = TURN * SLICE / FULL_READ
"""Work shorter than this is never dense (:func:`dense`): a driver need not ask."""


def dense(elapsed: float, size: int) -> bool:
    """Whether input that took ``elapsed`` seconds for ``size`` bytes is dense: it took
    over :data:`TURN`, or it is at least a slice and at that rate a full read would. Only
    dense input starts (or renews) sliced mode: a busy session of larger frames, whose
    turns of slices also run to :data:`TURN`, lets it lapse (renewing it on the length of
    the turn alone kept such a session sliced for good, a quarter of its throughput lost
    to the turns). Reads under a slice are judged on their time alone: their fixed cost
    would make any small read look dense per byte."""
    return elapsed > TURN or (size >= SLICE and elapsed * FULL_READ > TURN * size)


class InputSlicer:
    """One session's sliced mode, and the rest of a read held back: the policy both drivers
    apply (:meth:`holds` on each read, :meth:`worked` after each read or turn of slices);
    they keep only the waiting (a loop turn, an anyio checkpoint).

    Args:
        whole_frames: the engine's ``Engine.whole_frames``, which slices are cut by (``None``:
            by bytes alone).
        never: input that must not be cut (a message transport: one whole message a read).
    """

    __slots__ = ("_read", "_whole_frames", "never", "pending", "until")

    def __init__(
        self, whole_frames: Callable[[memoryview, int, int], int] | None = None, *, never: bool = False
    ) -> None:
        self.until = 0.0
        """The ``perf_counter`` time until which input goes in slices."""
        self.pending: memoryview | None = None
        """The rest of a read, in sliced mode."""
        self.never = never
        """Never slice (whole messages)."""
        self._whole_frames = whole_frames
        self._read = b""  # the read ``pending`` is the rest of

    def holds(self, data: bytes, now: float) -> bool:
        """Whether ``data``, a read at ``now`` (``perf_counter``), goes in slices; if so it is
        held for :meth:`next_slice`."""
        if len(data) > SLICE and now < self.until and not self.never:
            self.hold(data)
            return True
        return False

    def worked(self, start: float, elapsed: float, size: int) -> None:
        """``size`` bytes took ``elapsed`` seconds of work from ``start``: dense input
        (:func:`dense`) starts or renews sliced mode."""
        if size and dense(elapsed, size):
            self.until = start + SLICED_FOR

    def hold(self, data: bytes) -> None:
        """Keep ``data`` (a read in sliced mode) for :meth:`next_slice`."""
        self._read = data
        self.pending = memoryview(data)

    def next_slice(self) -> bytes | None:
        """The next slice of what is held, or None: :data:`SLICE` bytes, or more to end
        where the first :data:`SLICE_FRAMES` frames end (by ``whole_frames``)."""
        pending = self.pending
        if pending is None:
            return None
        cut = SLICE
        whole_frames = self._whole_frames
        if whole_frames is not None:
            cut = max(cut, whole_frames(pending, 0, SLICE_FRAMES))
        if len(pending) > cut:
            self.pending = pending[cut:]
            return bytes(pending[:cut])
        read, self._read, self.pending = self._read, b"", None
        # The whole read in one slice (a few large frames) is the read itself, not a copy.
        return read if len(pending) == len(read) else bytes(pending)
