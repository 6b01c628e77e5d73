"""Passive decoding of captured bytes into :class:`~polymux.tracing.FrameRecord` rows:
what every format shares. What a format's frames mean is its own frame-record walk
(:class:`polymux.formats.Walk`, in the format's module, over its own codec); this module
drives it.

Both directions of one connection are decoded together, chunk by chunk in time order, with
the format's :mod:`polymux.wire` codec (no engine runs: nothing is answered, nothing is
sent); the walk follows the engines' rules only as far as a bystander can: channel keys,
frame types and the credit each direction has left.

How offsets stay exact: each direction's codec is fed whole chunks (its fast path); the
frames it returns are sized by the walk's formula, and the sum must equal what the codec
consumed (``fed - pending``). Where it does not (an encoding that is legal but not
minimal, such as a wide msgpack integer), the bytes since the last known frame boundary
are replayed through a fresh codec, a frame at a time, which gives every frame's end
exactly. Where the codec raises, the shortest prefix that makes a fresh codec raise is
found by bisection, and the bad frame starts after the last complete frame before it.
Memory per direction is bounded by the codec's largest frame.

The live path (:meth:`FrameDecoder.feed_parts`, what ``CaptureRecorder(mode="records")``
runs) walks frame headers itself where the format's walk knows their common shapes
(:meth:`polymux.formats.Walk.fast_header`): a data frame's payload is skipped, never
copied (only its first ``payload_prefix`` bytes are kept), whatever views it arrives in;
anything else (a handshake, an unusual encoding, a malformed header) goes to the codec
from that frame on, so verdicts and error messages are the codec's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from polymux._types import BytesLike
from polymux.exceptions import ProtocolError
from polymux.formats import Format, resolve
from polymux.formats.records import C2S, S2C, Chunk, FrameRecord
from polymux.formats.walk import Codec, Elided, Violation


if TYPE_CHECKING:
    import pyarrow as pa

    from polymux.formats.columns import RecordColumns


__all__ = ["FrameDecoder", "decode_batches", "decode_chunks"]


class _Direction:
    """Decoding state of one direction."""

    __slots__ = (
        "boundary",
        "codec",
        "fast",
        "fed",
        "frame",
        "hold",
        "keep",
        "kept",
        "last_time",
        "name",
        "skip",
        "stopped",
        "tail",
    )

    def __init__(self, name: str, codec: Codec, fast: bool) -> None:
        self.name = name
        self.codec = codec
        self.fed = 0  # stream offset just past the bytes fed to the codec (or walked)
        self.boundary = 0  # stream offset just past the last complete frame
        self.tail = bytearray()  # the bytes from boundary to fed (what the codec holds)
        self.stopped = False
        self.last_time = 0
        # The live path (FrameDecoder.feed_parts): ``fast`` while the codec holds nothing
        # and the walk walks headers itself; ``hold``: the start of a header cut by the
        # end of a part; ``frame``: (size, payload length, data, fields) of the frame being
        # walked, ``skip`` its payload bytes still to come, ``kept`` the payload bytes kept
        # so far and ``keep`` how many more to keep.
        self.fast = fast
        self.hold: bytearray | None = None
        self.frame: tuple[int, int, bool, tuple[Any, ...]] | None = None
        self.skip = 0
        self.keep = 0
        self.kept = bytearray()


class FrameDecoder:
    """Incremental decoder of one connection (both directions) into frame records.

    ``feed(chunk)`` takes chunks in time order (both directions interleaved) and returns
    the records of the frames they complete; ``finish()`` returns the records for what is
    left (a ``truncated`` record per direction that ends inside a frame). Bad input never
    raises: a violation gives one ``violation`` record at the bad frame's offset, with the
    codec's message, and that direction is not decoded further.

    Args:
        format: a :class:`~polymux.formats.Format` or the name of one
            (:data:`polymux.PROTOCOLS`; ``ValueError`` otherwise): its frame-record walk
            decodes.
        session: the ``session`` value of the records.
        one_way: only one direction was captured: credit is not tracked (``None``, no
            flow-control violations), and Streamux assumes the other side's initialize
            message equalled this side's.
        payload_prefix: keep the first bytes of each frame's payload, at most this many
            (:meth:`take_payloads`); ``None``: keep none.
        codec_only: decode every frame with the codec, never walking headers (the
            reference the walk is tested against; slower, same records).
        columns: keep the records column by column, where the walk's vectorised runs
            (:meth:`polymux.formats.Walk.column_run`) put theirs: :meth:`feed` and
            :meth:`finish` then return nothing, :meth:`take_batch` gives the records
            (:func:`decode_batches`). Not with ``payload_prefix``.
    """

    def __init__(
        self,
        format: str | Format,
        *,
        session: str,
        one_way: bool = False,
        payload_prefix: int | None = None,
        codec_only: bool = False,
        columns: RecordColumns | None = None,
    ) -> None:
        if payload_prefix is not None and payload_prefix < 0:
            raise ValueError(f"payload_prefix must be >= 0, got {payload_prefix}")
        if columns is not None and payload_prefix is not None:
            raise ValueError("FrameDecoder: columns and payload_prefix cannot go together")
        fmt = resolve(format)
        self.format = fmt.name
        """The format's name (the records' ``format``)."""
        self.session = session
        """The records' ``session``."""
        self.one_way = one_way
        """Only one direction is decoded (see the class docstring)."""
        self._walker = fmt.walk(self)
        fast = self._walker.MAX_HEAD > 0 and not codec_only
        self._walks = fast
        self._dirs = {name: _Direction(name, self._walker.codec(name), fast) for name in (C2S, S2C)}
        self._out: list[FrameRecord] = []
        self._to_release: list[str] = []
        self._time = 0
        self._prefix = payload_prefix
        self._payloads: list[bytes | None] | None = None if payload_prefix is None else []
        self._taken = 0  # records whose payloads take_payloads() has handed out
        self._columns = columns
        self._held: list[FrameRecord] = []  # with columns: records not in them yet

    def feed(self, chunk: Chunk) -> list[FrameRecord]:
        """Decode one ``(time_ns, direction, data)`` chunk; return the new records."""
        time_ns, direction, data = chunk
        d = self._dirs.get(direction)
        if d is None:
            raise ValueError(f"chunk direction must be 'c2s' or 's2c', got {direction!r}")
        self._time = time_ns
        if not d.stopped and data:
            d.last_time = time_ns
            if self._walks:
                self._walk(d, (data,), time_ns)
            else:
                self._feed(d, bytes(data), time_ns)
            self._release_held(time_ns)
        return self._take()

    def feed_parts(self, time_ns: int, direction: str, parts: Sequence[BytesLike]) -> list[FrameRecord]:
        """Decode bytes of one direction given as parts (a batch the session wrote, or a
        chunk it received), all at ``time_ns``; return the new records.

        The live path: a data frame's payload is never copied, whatever views it arrives
        in (its first ``payload_prefix`` bytes are kept), for formats whose walk walks
        headers; the others, and anything unusual, go through the codec as in :meth:`feed`.
        """
        d = self._dirs.get(direction)
        if d is None:
            raise ValueError(f"chunk direction must be 'c2s' or 's2c', got {direction!r}")
        self._time = time_ns
        if not d.stopped:
            self._walk(d, parts, time_ns)
            if self._to_release:
                self._release_held(time_ns)
        return self._take()

    def take_payloads(self) -> list[bytes | None]:
        """With ``payload_prefix`` set: the payload prefixes of the records returned since
        the last call, in the same order (``None`` where a record has none: one record per
        frame carries them, the ``data`` one if the frame has one, else its first)."""
        payloads = self._payloads
        if payloads is None:
            raise ValueError("FrameDecoder: no payload_prefix was given")
        out = payloads[: self._taken]
        del payloads[: self._taken]
        self._taken = 0
        return out

    @property
    def held(self) -> int:
        """With ``columns``: the records held (:meth:`take_batch` takes them)."""
        columns = self._columns
        return 0 if columns is None else columns.rows + len(self._held)

    def take_batch(self) -> pa.RecordBatch:
        """With ``columns``: the records held, in decode order, as a record batch of
        ``frame_schema()``; none are held after."""
        import pyarrow as pa

        from polymux.tracing.records import frame_schema

        columns = self._columns
        if columns is None:
            raise ValueError("FrameDecoder: no columns were given")
        held, self._held = self._held, []
        if not columns.rows:  # no run: the tuples the fast way
            return _tuples_batch(held)
        columns.add_records(held)
        arrays = columns.arrays(self.session, self.format)
        columns.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=frame_schema())

    def _release_held(self, time_ns: int) -> None:
        while self._to_release:
            other = self._dirs[self._to_release.pop()]
            if not other.stopped and other.fed > other.boundary:
                self._feed(other, b"", time_ns)

    def _take(self) -> list[FrameRecord]:
        out = self._out
        if not out:
            return []
        self._out = []
        if self._columns is not None:
            self._held += out
            return []
        payloads = self._payloads
        if payloads is not None:
            self._taken += len(out)
            if len(payloads) < self._taken:
                payloads += [None] * (self._taken - len(payloads))
        return out

    def finish(self) -> list[FrameRecord]:
        """Records for the end of the capture: ``truncated`` where a direction stopped
        inside a frame."""
        for d in self._dirs.values():
            if d.stopped:
                continue
            pending = d.fed - d.boundary
            if pending:
                what = self._walker.truncated_detail(d.name)
                self._out.append(
                    self._walker.rec(
                        d.name,
                        d.last_time,
                        d.boundary,
                        "",
                        "truncated",
                        pending,
                        error=f"{self.format}: the {d.name} stream ends inside a {what} "
                        f"({pending} bytes at offset {d.boundary})",
                    )
                )
            d.stopped = True
        return self._take()

    def release(self, direction: str) -> None:
        """Bytes held by ``direction``'s codec can now be decoded (the walk says so, from
        inside the other direction's feed; they are decoded right after it)."""
        self._to_release.append(direction)

    def _feed(self, d: _Direction, data: bytes, time_ns: int) -> None:
        start = d.boundary
        try:
            items = d.codec.feed(data)
        except ProtocolError as exc:
            self._replay_to_error(d, bytes(d.tail) + data, time_ns, exc)
            return
        d.fed += len(data)
        consumed = d.fed - d.codec.pending
        size = self._walker.size
        sizes = [size(item) for item in items]
        if start + sum(sizes) != consumed:
            sizes = self._exact_sizes(d, bytes(d.tail) + data, sizes)
        # Keep the bytes the codec holds (from the new boundary), for a later replay.
        drop = consumed - start
        if drop >= len(d.tail):
            d.tail = bytearray(data[drop - len(d.tail) :])
        else:
            del d.tail[:drop]
            d.tail += data
        d.boundary = consumed
        self._emit(d, items, sizes, start, time_ns)

    def _walk(self, d: _Direction, parts: Sequence[BytesLike], time_ns: int) -> None:
        """The live path over parts of one direction: walk the frames whose headers the
        walk knows, skipping data payloads; hand the codec the rest (from a frame
        boundary on) and take over again once it holds nothing. The hot loop of
        frame-record capture, written for few Python calls per frame: a frame whose
        record :meth:`polymux.formats.Walk.fast_record` gives costs one header parse and that call."""
        walk = self._walker
        head = walk.fast_header
        fast_record = walk.fast_record
        run = walk.fast_run
        runs = 2 * walk.MAX_HEAD  # a part with more than this may hold several frames
        column_run = walk.column_run
        columns = self._columns
        name = d.name
        prefix = self._prefix or 0
        out = self._out
        payloads = self._payloads
        count = len(parts)
        i = 0
        while i < count:
            part = parts[i]
            i += 1
            end = len(part)
            if not end:
                continue
            d.last_time = time_ns
            pos = 0
            while pos < end:
                if d.skip:  # inside a walked frame's payload
                    skip = d.skip
                    take = skip if skip < end - pos else end - pos  # noqa: FURB136 - no call in the hot loop
                    if d.keep:
                        k = d.keep if d.keep < take else take  # noqa: FURB136
                        d.kept += part[pos : pos + k]  # (a few bytes of a data payload)
                        d.keep -= k
                    pos += take
                    d.fed += take
                    d.skip = skip - take
                    if take == skip:
                        size, payload_len, data, fields = d.frame  # type: ignore[misc]
                        d.frame = None
                        kept = bytes(d.kept)
                        record = fast_record(name, fields, data, payload_len, kept, d.boundary, time_ns)
                        if record is None:  # declined, nothing changed: the codec's records
                            self._complete_slow(d, time_ns, size, payload_len, data, fields, kept)
                            if d.stopped:
                                return
                            continue
                        d.boundary += size
                        out.append(record)
                        if payloads is not None:
                            if len(payloads) == self._taken + len(out) - 1:
                                payloads.append(kept[:prefix])
                            else:
                                self._attach(len(out) - 1, kept[:prefix])
                    continue
                if not d.fast:  # the codec's turn: it holds part of a frame, or the format is its
                    rest = part[pos:] if pos else part
                    self._feed(d, rest if type(rest) is bytes else bytes(rest), time_ns)
                    d.fast = self._walks and not d.stopped and d.codec.pending == 0
                    if d.stopped:
                        return
                    break
                # a frame boundary (or a header begun in an earlier part)
                hold = d.hold
                if hold is None:
                    if end - pos > runs:  # many frames here, perhaps: one loop over them
                        if columns is not None:  # or vectorised, for very many
                            if self._held:  # (the records before the run go first)
                                columns.add_records(self._held)
                                self._held = []
                            if out:
                                columns.add_records(out)
                                out.clear()
                            stop = column_run(name, part, pos, end, d.boundary, time_ns, columns)
                            if stop != pos:
                                d.boundary += stop - pos
                                d.fed += stop - pos
                                pos = stop
                                continue
                        if payloads is not None and len(payloads) < self._taken + len(out):
                            payloads += [None] * (self._taken + len(out) - len(payloads))
                        stop = run(name, part, pos, end, d.boundary, time_ns, out, payloads, prefix)
                        if stop != pos:
                            d.boundary += stop - pos
                            d.fed += stop - pos
                            pos = stop
                            continue
                    found = head(name, part, pos, end)
                    if found is None:  # the header goes on in the next part
                        d.hold = bytearray(part[pos:])
                        d.fed += end - pos
                        break
                    if found is False:
                        d.fast = False
                        continue
                    header_len, payload_len, data, fields = found  # type: ignore[misc]
                    at = pos + header_len
                    whole = at + payload_len <= end  # the whole frame is in this part
                    if whole or (at == end and i < count and len(parts[i]) == payload_len):
                        # (or its payload is the next part: a batch the session wrote)
                        if whole:
                            pos = at + payload_len
                            body = part[at:pos]
                        else:
                            pos = end
                            body = parts[i]
                            i += 1
                        size = header_len + payload_len
                        d.fed += size
                        kept = bytes(body[:prefix] if data else body)
                        record = fast_record(name, fields, data, payload_len, kept, d.boundary, time_ns)
                        if record is None:  # declined, nothing changed: the codec's records
                            self._complete_slow(d, time_ns, size, payload_len, data, fields, kept)
                            if d.stopped:
                                return
                            continue
                        d.boundary += size
                        out.append(record)
                        if payloads is not None:
                            if len(payloads) == self._taken + len(out) - 1:
                                payloads.append(kept[:prefix])
                            else:
                                self._attach(len(out) - 1, kept[:prefix])
                        continue
                    used = header_len
                else:
                    have = len(hold)
                    more = part[pos : pos + walk.MAX_HEAD]
                    buf = bytes(hold) + bytes(more)
                    found = head(name, buf, 0, len(buf))
                    if found is None and len(buf) < walk.MAX_HEAD:
                        hold += more
                        d.fed += len(more)
                        pos += len(more)
                        continue
                    if found is None or found is False:
                        # the codec takes over from the frame's first byte
                        d.fast = False
                        d.hold = None
                        d.fed = d.boundary
                        self._feed(d, buf[:have] + bytes(part[pos:]), time_ns)
                        d.fast = self._walks and not d.stopped and d.codec.pending == 0
                        if d.stopped:
                            return
                        break
                    d.hold = None
                    header_len, payload_len, data, fields = found  # type: ignore[misc]
                    used = header_len - have  # the header's bytes in this part
                pos += used
                d.fed += used
                if not payload_len:
                    self._complete(d, time_ns, header_len, 0, data, fields, b"")
                    if d.stopped:
                        return
                    continue
                d.frame = (header_len + payload_len, payload_len, data, fields)
                d.skip = payload_len
                d.keep = (prefix if prefix < payload_len else payload_len) if data else payload_len  # noqa: FURB136
                d.kept = bytearray()

    def _complete(
        self,
        d: _Direction,
        time_ns: int,
        size: int,
        payload_len: int,
        data: bool,
        fields: tuple[Any, ...],
        kept: bytes,
    ) -> None:
        """A walked frame is whole (``kept``: its payload, or a data frame's first bytes):
        its records."""
        record = self._walker.fast_record(d.name, fields, data, payload_len, kept, d.boundary, time_ns)
        if record is None:
            self._complete_slow(d, time_ns, size, payload_len, data, fields, kept)
            return
        d.boundary += size
        self._out.append(record)
        if self._payloads is not None:
            self._attach(len(self._out) - 1, kept[: self._prefix])

    def _complete_slow(
        self,
        d: _Direction,
        time_ns: int,
        size: int,
        payload_len: int,
        data: bool,
        fields: tuple[Any, ...],
        kept: bytes,
    ) -> None:
        """:meth:`_complete` for a frame ``fast_record`` declined (it changed nothing):
        its records from the codec's item."""
        offset = d.boundary
        walk = self._walker
        d.boundary = offset + size
        item = walk.fast_item(fields, Elided(kept, payload_len) if data and payload_len else kept)
        out = self._out
        try:
            records = walk.records(d.name, item, offset, time_ns)
        except Violation as exc:
            out.extend(exc.records)
            self._violation(d, offset, time_ns, str(exc))
            return
        if self._payloads is None:
            out += records
        else:
            start = len(out)
            out += records
            if records:
                self._attach(start, kept[: self._prefix])

    def _emit(
        self,
        d: _Direction,
        items: list[Any],
        sizes: list[int],
        offset: int,
        time_ns: int,
    ) -> int | None:
        """Records of ``items`` (of ``sizes`` bytes), the first at ``offset``. Returns the
        offset past the last one, or None if one broke the protocol (a violation record
        at its offset, and the direction stops). With ``payload_prefix``, each item's
        payload prefix goes with its records."""
        out = self._out
        records = self._walker.records
        name = d.name
        keep = self._payloads
        try:
            for item, n in zip(items, sizes, strict=True):
                start = len(out)
                out.extend(records(name, item, offset, time_ns))
                if keep is not None and len(out) > start:
                    self._attach(start, bytes(memoryview(self._walker.payload(item))[: self._prefix]))
                offset += n  # past this frame only once its records are in
        except Violation as exc:
            out.extend(exc.records)
            self._violation(d, offset, time_ns, str(exc))
            return None
        return offset

    def _attach(self, start: int, payload: bytes | None) -> None:
        """Give the payload prefix to the frame's records from ``start`` on: to its
        ``data`` record, else its first."""
        keep = self._payloads
        assert keep is not None
        out = self._out
        base = self._taken  # payloads[base + i] belongs to out[i]
        if len(out) == start + 1 and len(keep) == base + start:
            keep.append(payload)  # one record, nothing to pad: the common case
            return
        keep += [None] * (base + len(out) - len(keep))
        at = start
        for i in range(start, len(out)):
            if out[i].frame_type == "data":
                at = i
                break
        keep[base + at] = payload

    def _violation(self, d: _Direction, offset: int, time_ns: int, message: str) -> None:
        self._out.append(self._walker.rec(d.name, time_ns, offset, "", "violation", error=message))
        d.stopped = True
        d.tail = bytearray()

    def _fresh(self, d: _Direction) -> Codec:
        return self._walker.codec(d.name)

    def _exact_sizes(self, d: _Direction, data: bytes, guesses: list[int]) -> list[int]:
        """Sizes of the items a codec decoded from ``data`` (from the boundary), found by
        replaying through a fresh codec: minimal sizes first, then a byte at a time."""
        codec = self._fresh(d)
        sizes: list[int] = []
        pos = 0
        for guess in guesses:
            got = codec.feed(data[pos : pos + guess])
            end = pos + guess
            while not got and end < len(data):
                got = codec.feed(data[end : end + 1])
                end += 1
            sizes.append(end - pos)
            pos = end
        return sizes

    def _replay_to_error(self, d: _Direction, data: bytes, time_ns: int, exc: ProtocolError) -> None:
        """The codec raised inside ``data`` (the bytes from the boundary). Find the
        shortest prefix of ``data`` that makes a fresh codec raise (errors only appear as
        bytes are added: a binary search, each probe at the codec's full speed); the
        frames the prefix before it holds are decoded and emitted, and the violation is
        reported where the bad frame starts (after the last complete frame)."""
        error = exc
        lo, hi = 0, len(data)  # data[:lo] decodes; data[:hi] raises
        try:
            self._fresh(d).feed(data)
        except ProtocolError as probe:
            error = probe
            while hi - lo > 1:
                mid = (lo + hi) // 2
                try:
                    self._fresh(d).feed(data[:mid])
                except ProtocolError as probe:
                    error = probe
                    hi = mid
                else:
                    lo = mid
        else:  # the fresh codec disagrees with the live one: report at the boundary
            lo = 0
        codec = self._fresh(d)
        items = codec.feed(data[:lo])
        good = lo - codec.pending  # bytes of complete frames before the bad one
        sizes = [self._walker.size(item) for item in items]
        if sum(sizes) != good:
            sizes = self._exact_sizes(d, data[:good], sizes)
        offset = self._emit(d, items, sizes, d.boundary, time_ns)
        if offset is not None:
            self._violation(d, offset, time_ns, str(error))


def decode_chunks(
    format: str | Format, chunks: Iterable[Chunk], *, session: str, one_way: bool = False
) -> Iterator[FrameRecord]:
    """Decode the chunks of one connection (both directions, in time order) into frame
    records, with the frame-record walk of ``format`` (a :class:`~polymux.formats.Format`
    or its name) over its :mod:`polymux.wire` codec.

    Never raises on bad input: a protocol violation becomes one ``violation`` record (at
    the byte offset where the bad frame starts in its direction, ``error`` the codec's
    message) and that direction stops there; a stream that ends inside a frame gives a
    ``truncated`` record. An unknown ``format`` or a direction other than ``"c2s"`` /
    ``"s2c"`` raises ``ValueError`` (a caller's mistake, not bad input). ``one_way``: see
    :class:`FrameDecoder`.
    """
    decoder = FrameDecoder(format, session=session, one_way=one_way)
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.finish()


def decode_batches(
    format: str | Format,
    chunks: Iterable[Chunk],
    *,
    session: str,
    one_way: bool = False,
    rows: int = 65536,
) -> Iterator[pa.RecordBatch]:
    """:func:`decode_chunks`, as Arrow record batches of
    ``frame_schema()`` (the same records in the same order), of at least
    ``rows`` records each but the last: what the pipeline ingests. Where the format's walk
    has vectorised runs (:meth:`polymux.formats.Walk.column_run`; with numpy), chunks of
    many common frames become columns without a Python object per record."""
    from polymux.formats import columns

    if not columns.available():
        decoder = FrameDecoder(format, session=session, one_way=one_way)
        records: list[FrameRecord] = []
        for chunk in chunks:
            records += decoder.feed(chunk)
            if len(records) >= rows:
                yield _tuples_batch(records)
                records = []
        records += decoder.finish()
        if records:
            yield _tuples_batch(records)
        return
    decoder = FrameDecoder(format, session=session, one_way=one_way, columns=columns.RecordColumns())
    for chunk in chunks:
        decoder.feed(chunk)
        if decoder.held >= rows:
            yield decoder.take_batch()
    decoder.finish()
    if decoder.held:
        yield decoder.take_batch()


def _tuples_batch(records: list[FrameRecord]) -> pa.RecordBatch:
    """Records as a batch of ``frame_schema()``: one pass in C over the
    tuples (a struct array), then its columns."""
    import pyarrow as pa

    from polymux.tracing.records import frame_schema

    schema = frame_schema()
    return pa.RecordBatch.from_arrays(
        pa.array(records, type=pa.struct(list(schema))).flatten(), schema=schema
    )
