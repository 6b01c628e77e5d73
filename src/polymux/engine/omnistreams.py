"""Sans-I/O engine for omnistreams (``specs/omnistreams-multiplexer.md``, PROTOCOL-NOTES A3).

Rules:

* Streams are **one-way**: the opener (initiator) writes, the acceptor reads. A channel
  opened here is therefore send-only for its opener and receive-only for its acceptor
  (:attr:`OmnistreamsEngine.one_way`; the asyncio layer makes the other half fail clearly).
  For a conversation, open a stream each way (``Session.open_pair``).
* Ids are per direction: CREATE, DATA, END and CANCEL_RECEIVE name the *sender's* ids,
  REQUEST_DATA and CANCEL_SEND name ids the *receiver* was given. We hand out our ids
  0..255 least-recently-used first (as the npm package does) and recycle one once its
  stream ended or was cancelled; a 257th concurrent stream raises ``RuntimeError`` (the
  session turns it into ``LimitExceeded``).
* Creation metadata is a UTF-8 JSON object: ``{"name": ..., "chunkSize": N, ...}``; other
  keys are kept for the application (:meth:`OmnistreamsEngine.metadata`). Metadata that is
  not a JSON object is accepted as opaque bytes (name ``""``, no chunk size).
* Credit counts **messages**: a writer splits data into chunks of at most its announced
  ``chunkSize`` and sends no more messages than the reader requested (REQUEST_DATA, 1..255
  per message). A reader grants ``receive_window // chunkSize`` messages (at least one)
  and re-grants them as the application consumes the bytes. A larger chunk than announced
  (or than ``max_message_size`` when none was announced) is a protocol error, as is a
  message beyond the credit (:class:`~polymux.exceptions.FlowControlError`).
* Data for an id that is not open gets CANCEL_SEND (as the spec says) and is ignored; data,
  END or CANCEL for a stream we cancelled is ignored until the sender re-creates the id;
  data or END after the stream's END is a protocol error. (One race is the protocol's own:
  a cancel that crosses the END of a stream whose id the sender reuses at once cancels the
  new stream. Ids are handed out least-recently-used first to make that unlikely.)
* Cancelling: the receiver sends CANCEL_SEND; the sender sends CANCEL_RECEIVE (spec
  numbering). The legacy numbering has no CANCEL_RECEIVE: a sender's reset is sent as
  STREAM_END there (the only way to release the peer's stream) and the peer sees a normal end.
* Control messages (:meth:`OmnistreamsEngine.send_control`, :class:`ControlReceived`) are
  session-level bytes.
* Framing: in *message mode* (WebSocket) every :meth:`receive_data` call is one message and
  every element of :meth:`data_to_send` is one message; otherwise messages carry polymux's
  4-byte big-endian length prefix (:mod:`polymux.wire.omnistreams`).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from typing import Any

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine.base import DataRuns, Engine
from polymux.engine.channel import ChannelRecord
from polymux.engine.events import (
    ChannelClosed,
    ChannelEnded,
    ChannelOpened,
    ChannelReset,
    ControlReceived,
    CreditAvailable,
    Event,
)
from polymux.engine.flow import MessageCredit, MessageWindow, budget_window, split_count
from polymux.exceptions import FlowControlError, ProtocolError
from polymux.wire import omnistreams as wire
from polymux.wire.omnistreams import Kind


__all__ = ["ControlReceived", "OmnistreamsEngine", "decode_metadata", "encode_metadata"]


def encode_metadata(name: str, chunk_size: int, extra: Mapping[str, Any] | None = None) -> bytes:
    """polymux's creation metadata: a UTF-8 JSON object with ``name`` and ``chunkSize``."""
    obj: dict[str, Any] = dict(extra or {})
    obj["name"] = name
    obj["chunkSize"] = chunk_size
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_metadata(raw: BytesLike) -> dict[str, Any] | None:
    """The metadata as a JSON object, or ``None`` when it is not one (opaque bytes)."""
    try:
        obj = json.loads(bytes(raw).decode())
    except (UnicodeDecodeError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


class OmnistreamsEngine(Engine):
    """One side of an omnistreams connection.

    Args:
        config: ``receive_window`` (bytes; the message credit a reader grants is
            ``receive_window // chunkSize``), ``send_frame`` (our chunk size, capped by
            ``max_message_size - 2``), ``max_message_size`` (largest message accepted,
            default 1 MiB + 2) and ``omnistreams_numbering``.
        numbering: ``"spec"`` or ``"legacy"``; overrides the config's.
        message_mode: True when the transport keeps message boundaries (WebSocket).
    """

    has_flow_control = True
    needs_acceptance = False
    one_way = True
    """Streams carry data from their opener to their acceptor only."""
    has_controls = True

    def __init__(
        self, config: SessionConfig | None = None, *, numbering: str | None = None, message_mode: bool = False
    ) -> None:
        super().__init__()
        self.config = config = config or SessionConfig()
        name = numbering or config.omnistreams_numbering
        if name not in wire.NUMBERINGS:
            raise ValueError(f"omnistreams numbering must be 'spec' or 'legacy', got {name!r}")
        self.numbering = wire.NUMBERINGS[name]
        self.format = "omnistreams" if name == "spec" else "omnistreams-legacy"
        self.message_mode = message_mode
        self.max_message = config.max_message_size or wire.MAX_MESSAGE_SIZE
        if self.max_message < 3:
            raise ValueError(f"omnistreams: max_message_size must be >= 3, got {self.max_message}")
        self.chunk_size = min(config.send_frame, self.max_message - 2)
        """Payload bytes per STREAM_DATA message we send (announced as ``chunkSize``)."""
        self.max_frame = self.chunk_size
        self._decoder = None if message_mode else wire.LengthPrefixDecoder(self.max_message)
        self._free_ids: deque[int] = deque(range(256))
        self._senders: dict[int, ChannelRecord] = {}
        self._receivers: dict[int, ChannelRecord] = {}
        self._cancelled: set[int] = set()  # peer ids we cancelled: stale messages are dropped
        self._ended: set[int] = set()  # peer ids that ended and were not created again
        self._codes = {kind: self.numbering.codes.get(kind) for kind in Kind}
        self._lingering: list[ChannelRecord] = []  # accepted after their END: forgotten soon

    @property
    def ready(self) -> bool:
        """Always: omnistreams has no handshake."""
        return True

    # -- output -------------------------------------------------------------------------------

    def data_to_send(self) -> list[BytesLike]:
        """Return (and forget) the byte chunks to write, in order (in message mode, one
        element per message)."""
        if self._lingering:
            for record in self._lingering:
                self._channels.pop(record.handle, None)
            self._lingering.clear()
        return super().data_to_send()

    def _emit(self, kind: Kind, stream_id: int | None, payload: BytesLike = b"") -> None:
        code = self._codes[kind]
        if code is None:
            raise ValueError(
                f"{self.format}: the {self.numbering.name} numbering has no {kind.value} message"
            )
        header = bytes((code,)) if stream_id is None else bytes((code, stream_id))
        if self.message_mode:
            self._out.append(header + payload if payload else header)
            return
        size = len(header) + len(payload)
        if size > self.max_message:
            raise ValueError(
                f"{self.format}: a {size}-byte message exceeds max_message_size={self.max_message}"
            )
        self._out.append(wire.encode_length(size) + header)
        if payload:
            self._out.append(payload)

    # -- receiving ----------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Process bytes from the peer (one whole message in message mode); return the
        events. Then call :meth:`data_to_send` (cancels and credit may be queued)."""
        if self.closed:
            raise self._error("received data after the session ended")
        events: list[Event] = []
        runs = DataRuns(events)
        try:
            if self._decoder is None:
                if len(data) > self.max_message:
                    raise self._error(f"{len(data)}-byte message exceeds max_message_size={self.max_message}")
                self._on_message(wire.decode(data, self.numbering), runs, events)
            else:
                for raw in self._decoder.feed(data):
                    self._on_message(wire.decode(raw, self.numbering), runs, events)
            runs.flush()
        except ProtocolError as exc:
            self.closed = True
            if exc.format != self.format:
                raise ProtocolError(self.format, exc.detail) from None
            raise
        return events

    def _unfinished_input(self) -> tuple[int, str] | None:
        pending = self._decoder.pending if self._decoder is not None else 0
        return (pending, "length-prefixed message") if pending else None

    def _on_message(self, message: wire.Message, runs: DataRuns, events: list[Event]) -> None:
        kind, sid, payload = message
        if kind is Kind.DATA:
            assert sid is not None
            record = self._receivers.get(sid)
            if record is None:
                self._on_stray(sid, "STREAM_DATA")
                return
            chunk = record.extra["chunk"]
            assert isinstance(chunk, int)
            n = len(payload)
            if n > chunk:
                raise self._error(
                    f"STREAM_DATA of {n} bytes on {record.describe()} exceeds its chunkSize {chunk}"
                )
            recv = record.recv
            assert isinstance(recv, MessageWindow)
            if not record.accepted:
                self.closed = True
                raise FlowControlError(
                    self.format, f"STREAM_DATA on {record.describe()} before any STREAM_REQUEST_DATA"
                )
            if not recv.received_message(n):
                self.closed = True
                raise FlowControlError(
                    self.format,
                    f"STREAM_DATA beyond the credit on {record.describe()} ({recv.window} messages requested)",
                )
            if n:
                runs.add(record, payload, n)
            return
        runs.flush()
        if kind is Kind.CONTROL:
            events.append(ControlReceived(bytes(payload)))
        elif kind is Kind.CREATE:
            assert sid is not None
            self._on_create(sid, payload, events)
        elif kind is Kind.END:
            assert sid is not None
            record = self._receivers.pop(sid, None)
            if record is None:
                self._on_stray(sid, "STREAM_END")
                if sid in self._cancelled:
                    self._cancelled.discard(sid)  # the sender ended it before our cancel arrived
                    self._ended.add(sid)
                return
            self._ended.add(sid)
            record.remote_end = True
            if record.accepted:
                self._channels.pop(record.handle, None)
            # else: created and ended within one read: kept until the I/O layer accepts
            # (or rejects) the offer it has not seen yet, so the empty stream is not lost.
            events.append(ChannelEnded(record.handle))
            events.append(ChannelClosed(record.handle))
        elif kind is Kind.CANCEL_RECEIVE:
            assert sid is not None
            record = self._receivers.pop(sid, None)
            self._cancelled.discard(sid)
            if record is not None:
                self._channels.pop(record.handle, None)
                events.append(ChannelReset(record.handle, "cancelled by the sender"))
        elif kind is Kind.REQUEST_DATA:
            assert sid is not None
            record = self._senders.get(sid)
            count = payload[0]
            if record is None or count == 0:
                return  # a request racing with our end or cancel
            record.send.grow(count)
            events.append(CreditAvailable(record.handle))
        else:  # CANCEL_SEND
            assert sid is not None
            record = self._senders.get(sid)
            if record is not None:
                self._forget_sender(record)
                events.append(ChannelReset(record.handle, "cancelled by the receiver"))

    def _on_stray(self, sid: int, what: str) -> None:
        """A DATA or END for a peer id with no open stream."""
        if sid in self._cancelled:
            return  # in flight when we cancelled: ignored
        if sid in self._ended:
            raise self._error(f"{what} for stream {sid} after its STREAM_END")
        if what == "STREAM_END":
            raise self._error(f"STREAM_END for stream {sid}, which was never created")
        self._cancelled.add(sid)
        self._emit(Kind.CANCEL_SEND, sid)  # the spec: ignore the data and cancel

    def _on_create(self, sid: int, payload: BytesLike, events: list[Event]) -> None:
        if sid in self._receivers:
            raise self._error(f"CREATE_RECEIVE_STREAM for stream {sid}, which is already open")
        self._cancelled.discard(sid)
        self._ended.discard(sid)
        raw = bytes(payload)
        meta = decode_metadata(raw)
        name = ""
        chunk = self.max_message - 2
        if meta is not None:
            value = meta.get("name", "")
            name = value if isinstance(value, str) else str(value)
            announced = meta.get("chunkSize")
            if announced is not None:
                if (
                    not isinstance(announced, int)
                    or isinstance(announced, bool)
                    or not 0 < announced <= self.max_message - 2
                ):
                    raise self._error(
                        f"chunkSize {announced!r} of stream {sid} must be an int in 1..{self.max_message - 2}"
                    )
                chunk = announced
        # The byte window fits the session's memory budget with the other streams'.
        config = self.config
        granted = sum(
            r.recv.window * r.send.chunk
            for r in self._channels.values()
            if r.recv is not None and isinstance(r.send, MessageCredit)
        )
        window = max(1, budget_window(config.receive_window, config.max_session_memory, granted) // chunk)
        record = ChannelRecord(
            handle=self._new_handle(),
            wire_id=sid,
            local_origin=False,
            name=name,
            send=MessageCredit(chunk),
            recv=MessageWindow(window, max(1, window // 4)),
            local_end=True,  # we never write on it
        )
        record.extra["chunk"] = chunk
        record.extra["metadata"] = raw
        record.extra["meta"] = meta
        self._channels[record.handle] = record
        self._receivers[sid] = record
        if len(raw) > config.max_name_bytes:
            self.reject_channel(record.handle)  # metadata beyond max_name_bytes: refused
            return
        events.append(ChannelOpened(record.handle, name))

    # -- commands -----------------------------------------------------------------------------

    def open_channel(self, name: str = "", *, extra: Mapping[str, Any] | None = None) -> int:
        """Create a stream we write (CREATE_RECEIVE_STREAM with ``name``, our ``chunkSize``
        and the ``extra`` keys as metadata). It has no credit until the peer requests data.
        Raises ``RuntimeError`` when all 256 ids are in use."""
        if not self._free_ids:
            raise RuntimeError(f"{self.format}: all 256 stream ids are in use")
        sid = self._free_ids.popleft()
        metadata = encode_metadata(name, self.chunk_size, extra)
        record = ChannelRecord(
            handle=self._new_handle(),
            wire_id=sid,
            local_origin=True,
            name=name,
            send=MessageCredit(self.chunk_size),
            recv=None,
            accepted=True,
            remote_end=True,  # the peer never writes on it
        )
        record.extra["metadata"] = metadata
        record.extra["meta"] = decode_metadata(metadata)
        self._channels[record.handle] = record
        self._senders[sid] = record
        self._emit(Kind.CREATE, sid, metadata)
        return record.handle

    def accept_channel(self, channel: int) -> None:
        """Take an incoming stream: grant its initial credit (REQUEST_DATA)."""
        record = self._record(channel)
        if record.local_origin or record.accepted:
            raise RuntimeError(f"{self.format}: {record.describe()} is not a pending incoming stream")
        record.accepted = True
        if record.remote_end:
            # It ended before we took it: nothing to request. Its metadata stays readable
            # until the output is next collected (the I/O layer is still wiring it up).
            self._lingering.append(record)
            return
        recv = record.recv
        assert recv is not None
        for count in split_count(recv.window):
            self._emit(Kind.REQUEST_DATA, record.wire_id, bytes((count,)))

    def reject_channel(self, channel: int) -> None:
        """Refuse an incoming stream: CANCEL_SEND."""
        record = self._record(channel)
        if record.local_origin or record.accepted:
            raise RuntimeError(f"{self.format}: {record.describe()} is not a pending incoming stream")
        if record.remote_end:  # it ended already: nothing to cancel
            self._channels.pop(record.handle, None)
            return
        self._cancel_receiver(record)

    def send_credit(self, channel: int) -> int:
        """Bytes that fit in the messages the peer still requests (0 on a receive-only stream)."""
        record = self._channels.get(channel)
        if record is None or not record.local_origin or record.local_end:
            return 0
        send = record.send
        assert isinstance(send, MessageCredit)
        return send.available_bytes

    def send_data(self, channel: int, data: BytesLike, *more: BytesLike) -> None:
        """Queue ``data`` (then ``more``) as STREAM_DATA messages of at most ``chunkSize``
        bytes (views; several parts are joined first, since a message is one piece). The
        total must not exceed :meth:`send_credit`."""
        if more:
            data = b"".join((data, *more))
        record = self._record(channel)
        if not record.local_origin:
            raise RuntimeError(f"{self.format}: {record.describe()} is receive-only")
        if record.local_end:
            raise RuntimeError(f"{self.format}: cannot send on {record.describe()} after its end")
        send = record.send
        assert isinstance(send, MessageCredit)
        n = len(data)
        send.consume_bytes(n)
        sid = record.wire_id
        step = send.chunk
        if n <= step:
            self._emit(Kind.DATA, sid, data)
            return
        view = memoryview(data)
        for off in range(0, n, step):
            self._emit(Kind.DATA, sid, view[off : off + step])

    def end_channel(self, channel: int) -> bool:
        """Our stream: STREAM_END (its id is free again). A stream we read: we stop reading
        it, so it is cancelled (CANCEL_SEND) unless it already ended. Always closes."""
        record = self._channels.get(channel)
        if record is None:
            return True
        if record.local_origin:
            self._emit(Kind.END, record.wire_id)
            self._forget_sender(record)
        else:
            self._cancel_receiver(record)
        return True

    def reset_channel(self, channel: int, message: str | None = None) -> None:
        """Cancel a stream: CANCEL_SEND when we read it; CANCEL_RECEIVE when we write it
        (STREAM_END in the legacy numbering, which has no cancel from the sender)."""
        record = self._channels.get(channel)
        if record is None:
            return
        if not record.local_origin:
            self._cancel_receiver(record)
            return
        kind = Kind.CANCEL_RECEIVE if self._codes[Kind.CANCEL_RECEIVE] is not None else Kind.END
        self._emit(kind, record.wire_id)
        self._forget_sender(record)

    def ack_consumed(self, channel: int, n: int) -> None:
        """The application consumed ``n`` bytes of a stream we read: request more messages
        once a batch of whole messages is consumed."""
        record = self._channels.get(channel)
        if record is None or record.local_origin:
            return
        recv = record.recv
        assert isinstance(recv, MessageWindow)
        grant = recv.consumed_bytes(n)
        for count in split_count(grant):
            self._emit(Kind.REQUEST_DATA, record.wire_id, bytes((count,)))

    def send_control(self, data: BytesLike) -> None:
        """Queue a control message (session-level bytes, not tied to a stream)."""
        if len(data) + 1 > self.max_message:
            raise ValueError(
                f"{self.format}: a control message of {len(data)} bytes exceeds max_message_size={self.max_message}"
            )
        self._emit(Kind.CONTROL, None, bytes(data))

    def metadata(self, channel: int) -> bytes | None:
        """The creation metadata of a live stream, as sent on the wire."""
        raw = self._record(channel).extra["metadata"]
        assert isinstance(raw, bytes)
        return raw

    def metadata_object(self, channel: int) -> dict[str, Any] | None:
        """The creation metadata of a live stream as a JSON object (``None``: opaque bytes)."""
        meta = self._record(channel).extra["meta"]
        return meta if isinstance(meta, dict) else None

    def is_sender(self, channel: int) -> bool:
        """True when we write ``channel`` (we opened it), False when we read it."""
        return self._record(channel).local_origin

    @property
    def free_ids(self) -> int:
        """Stream ids still available for streams we open."""
        return len(self._free_ids)

    # -- helpers ------------------------------------------------------------------------------

    def _forget_sender(self, record: ChannelRecord) -> None:
        record.local_end = True
        self._channels.pop(record.handle, None)
        if self._senders.pop(record.wire_id, None) is not None:
            self._free_ids.append(record.wire_id)

    def _cancel_receiver(self, record: ChannelRecord) -> None:
        self._channels.pop(record.handle, None)
        self._receivers.pop(record.wire_id, None)
        self._cancelled.add(record.wire_id)
        self._emit(Kind.CANCEL_SEND, record.wire_id)
