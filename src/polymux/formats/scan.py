"""Frame boundary scans: the per-frame loops of the walks' vectorised runs
(:meth:`polymux.formats.Walk.column_run`), kept apart so that they can be compiled
(plain, type-annotated Python: no dynamic tricks).

A scan finds where the frames of the kinds its walk vectorises start, checking each
header as the walk's ``fast_run`` would; what else the walk needs of them (credit) is
worked out afterwards over all of them at once, with numpy. A scan stops at the first
frame of another kind, or not whole in ``buf[:end]``: the cost of a scan is the frames it
takes.
"""

from __future__ import annotations

import struct
from array import array


__all__ = ["yamux_starts"]

_HEADER = struct.Struct(">BBHII")  # polymux.wire.yamux.HEADER


def yamux_starts(buf: bytes | memoryview, pos: int, end: int, max_data: int, starts: array[int]) -> int:
    """Append to ``starts`` the offsets of the whole yamux frames from ``buf[pos]`` on
    that are plain Data (no flags, a stream, a payload of at most ``max_data`` bytes) or
    plain WindowUpdates (no flags, a stream, a delta); return the offset past the last one
    (the first frame of another kind, or not whole in ``buf[:end]``)."""
    unpack = _HEADER.unpack_from
    append = starts.append
    while end - pos >= 12:
        version, kind, flags, sid, length = unpack(buf, pos)
        if version or flags or kind > 1 or not sid or not length:
            break
        if kind:  # a WindowUpdate: the header is the frame
            append(pos)
            pos += 12
            continue
        stop: int = pos + 12 + length
        if stop > end or length > max_data:
            break
        append(pos)
        pos = stop
    return pos
