"""Frame records column by column: where a walk's vectorised runs
(:meth:`polymux.formats.Walk.column_run`) put the records of many frames at once, for
:func:`polymux.tracing.decode_batches` (the pipeline's decode of raw captures).

A record here is a row of integer columns (offsets, lengths, credits) and codes (channel
keys, frame types, directions: indexes into small tables), never a Python object per
record: the columns become Arrow arrays with a few vectorised calls per batch. Records
that went the general way (tuples, :class:`~polymux.formats.records.FrameRecord`) join the
columns in decode order: the decoder adds them (:meth:`RecordColumns.add_records`) before
each run.

numpy is needed (``polymux[spark]`` has it through pandas); :func:`available` says whether
it can be imported.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from polymux.formats.records import C2S, FRAME_TYPES, S2C, FrameRecord


if TYPE_CHECKING:
    import pyarrow as pa


__all__ = ["CREDIT_DIRS", "DIRECTIONS", "FRAME_TYPE_CODES", "NULL", "RecordColumns", "available"]

FRAME_TYPE_CODES = {name: i for i, name in enumerate(FRAME_TYPES)}
"""``frame_type`` -> its code in :data:`~polymux.formats.records.FRAME_TYPES`."""

DIRECTIONS = (C2S, S2C)
"""Direction codes: 0 ``c2s``, 1 ``s2c``."""

CREDIT_DIRS = ("", C2S, S2C)
"""``credit_dir`` codes: 0 none, 1 ``c2s``, 2 ``s2c``."""

NULL = -(2**63)
"""A null ``credit`` or ``ping_id`` in the integer columns (never a real value: both are
64-bit at most, and credits stay far from the bottom)."""

_DIRECTION_CODES = {name: i for i, name in enumerate(DIRECTIONS)}
_CREDIT_DIR_CODES = {name: i for i, name in enumerate(CREDIT_DIRS)}


def available() -> bool:
    """Whether numpy can be imported (the vectorised runs need it)."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    return True


class RecordColumns:
    """A session's records since the last :meth:`clear`, column by column. ``session``
    and ``format`` are the session's own (the caller gives them to :meth:`arrays`);
    ``error`` is kept apart, per row that has one (few do)."""

    __slots__ = (
        "_channel_codes",
        "_name_codes",
        "channel",
        "channel_name",
        "channels",
        "credit",
        "credit_dir",
        "direction",
        "errors",
        "flags",
        "frame_type",
        "length",
        "names",
        "offset",
        "ping_id",
        "rows",
        "time_ns",
    )

    def __init__(self) -> None:
        self.channels: list[str] = []
        """Channel keys by code (the :attr:`channel` column's table)."""
        self.names: list[str] = []
        """Channel names by code (the :attr:`channel_name` column's table)."""
        self._channel_codes: dict[str, int] = {}
        self._name_codes: dict[str, int] = {}
        self.clear()

    def clear(self) -> None:
        """Forget the rows (the channel and name tables stay: codes keep their meaning).
        New buffers: Arrow arrays made of the old ones may still be in use."""
        self.time_ns = array("q")
        self.direction = array("b")  # DIRECTIONS
        self.offset = array("q")
        self.channel = array("i")  # index into channels
        self.frame_type = array("b")  # FRAME_TYPE_CODES
        self.length = array("q")
        self.flags = array("q")
        self.credit = array("q")  # NULL: none
        self.credit_dir = array("b")  # CREDIT_DIRS
        self.ping_id = array("q")  # NULL: none
        self.channel_name = array("i")  # index into names; -1: null
        self.errors: dict[int, str] = {}  # row -> error
        self.rows = 0
        """Rows held."""

    def channel_code(self, key: str) -> int:
        """The code of channel key ``key``."""
        code = self._channel_codes.get(key)
        if code is None:
            code = self._channel_codes[key] = len(self.channels)
            self.channels.append(key)
        return code

    def name_code(self, name: str | None) -> int:
        """The code of channel name ``name`` (-1 for None)."""
        if name is None:
            return -1
        code = self._name_codes.get(name)
        if code is None:
            code = self._name_codes[name] = len(self.names)
            self.names.append(name)
        return code

    def add_records(self, records: Sequence[FrameRecord]) -> None:
        """Records that went the general way (tuples), appended in order."""
        if not records:
            return
        (_s, directions, times, _f, offsets, channels, types, lengths, flags, credits, credit_dirs, pings,
         errors, names) = zip(*records, strict=True)  # fmt: skip
        channel_codes, channel_code = self._channel_codes, self.channel_code
        name_codes, name_code = self._name_codes, self.name_code
        self.time_ns.extend(times)
        self.direction.extend([_DIRECTION_CODES[d] for d in directions])
        self.offset.extend(offsets)
        self.channel.extend([channel_codes[c] if c in channel_codes else channel_code(c) for c in channels])
        self.frame_type.extend([FRAME_TYPE_CODES[t] for t in types])
        self.length.extend(lengths)
        self.flags.extend(flags)
        self.credit.extend([NULL if c is None else c for c in credits])
        self.credit_dir.extend([_CREDIT_DIR_CODES[c] for c in credit_dirs])
        self.ping_id.extend([NULL if p is None else p for p in pings])
        self.channel_name.extend(
            [-1 if n is None else name_codes[n] if n in name_codes else name_code(n) for n in names]
        )
        for i, error in enumerate(errors):
            if error is not None:
                self.errors[self.rows + i] = error
        self.rows += len(records)

    def add(
        self,
        time_ns: int,
        direction: str,
        offset: Any,
        channel: Any,
        frame_type: Any,
        length: Any,
        flags: Any,
        credit: Any,
        credit_dir: Any,
        channel_name: Any,
    ) -> None:
        """One run's records, all at ``time_ns`` in ``direction``, with neither a ping id
        nor an error: the other arguments are numpy arrays of one length (int64, but the
        codes: int32 ``channel`` and ``channel_name``, int8 ``frame_type`` and
        ``credit_dir``; ``credit`` :data:`NULL` where it has none)."""
        import numpy as np

        n = len(offset)
        if not n:
            return
        self.time_ns.frombytes(np.full(n, time_ns, np.int64).tobytes())
        self.direction.frombytes(np.full(n, _DIRECTION_CODES[direction], np.int8).tobytes())
        self.offset.frombytes(np.ascontiguousarray(offset, np.int64).tobytes())
        self.channel.frombytes(np.ascontiguousarray(channel, np.int32).tobytes())
        self.frame_type.frombytes(np.ascontiguousarray(frame_type, np.int8).tobytes())
        self.length.frombytes(np.ascontiguousarray(length, np.int64).tobytes())
        self.flags.frombytes(np.ascontiguousarray(flags, np.int64).tobytes())
        self.credit.frombytes(np.ascontiguousarray(credit, np.int64).tobytes())
        self.credit_dir.frombytes(np.ascontiguousarray(credit_dir, np.int8).tobytes())
        self.ping_id.frombytes(np.full(n, NULL, np.int64).tobytes())
        self.channel_name.frombytes(np.ascontiguousarray(channel_name, np.int32).tobytes())
        self.rows += n

    def arrays(self, session: str, fmt: str) -> list[pa.Array]:
        """The rows as the 14 Arrow arrays of :func:`~polymux.formats.records.frame_schema`."""
        import numpy as np
        import pyarrow as pa

        n = self.rows

        def column(values: array[int], dtype: Any) -> Any:
            return np.frombuffer(values, dtype) if n else np.zeros(0, dtype)

        def strings(table: Sequence[str], codes: Any, nulls: bool = False) -> pa.Array:
            if len(table) > n:  # a big table (a session of many channels): the codes used only
                used = np.unique(codes[codes >= 0] if nulls else codes)
                table = [table[i] for i in used.tolist()]
                codes = (
                    np.where(codes < 0, -1, np.searchsorted(used, codes))
                    if nulls
                    else np.searchsorted(used, codes)
                )
            return pa.array(table, pa.string()).take(pa.array(codes, mask=codes < 0 if nulls else None))

        credit = column(self.credit, np.int64)
        ping = column(self.ping_id, np.int64)
        if self.errors:
            codes = np.full(n, -1, np.int32)
            codes[list(self.errors)] = np.arange(len(self.errors))
            error = strings(list(self.errors.values()), codes, nulls=True)
        else:
            error = pa.nulls(n, pa.string())
        return [
            pa.repeat(pa.scalar(session, pa.string()), n),
            strings(DIRECTIONS, column(self.direction, np.int8)),
            pa.array(column(self.time_ns, np.int64)),
            pa.repeat(pa.scalar(fmt, pa.string()), n),
            pa.array(column(self.offset, np.int64)),
            strings(self.channels, column(self.channel, np.int32)),
            strings(FRAME_TYPES, column(self.frame_type, np.int8)),
            pa.array(column(self.length, np.int64)),
            pa.array(column(self.flags, np.int64)),
            pa.array(credit, mask=credit == NULL),
            strings(CREDIT_DIRS, column(self.credit_dir, np.int8)),
            pa.array(ping, mask=ping == NULL),
            error,
            strings(self.names, column(self.channel_name, np.int32), nulls=True),
        ]
