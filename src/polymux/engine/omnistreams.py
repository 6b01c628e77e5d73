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
  per message). A reader grants ``receive_window // chunkSize`` messages (at least one,
  at most 1,024: :data:`~polymux.engine.flow.MAX_MESSAGE_CREDIT`, so that a peer choosing
  tiny chunks cannot make one CREATE cost thousands of grants) and re-grants them as the
  application consumes the bytes. A larger chunk than announced
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
from dataclasses import dataclass
from typing import Any

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine.base import DataRuns, Engine
from polymux.engine.channel import ChannelRecord, ChannelState, Input, Refuse, Transitions
from polymux.engine.events import (
    ChannelClosed,
    ChannelEnded,
    ChannelOpened,
    ChannelReset,
    ControlReceived,
    CreditAvailable,
    Event,
)
from polymux.engine.flow import MessageCredit, MessageWindow, budget_window, message_window, split_count
from polymux.engine.plane import NO_CREDIT_STEP
from polymux.engine.spec import Capabilities
from polymux.exceptions import FlowControlError, ProtocolError
from polymux.wire import omnistreams as wire
from polymux.wire.omnistreams import Kind


__all__ = [
    "CAPABILITIES",
    "ControlReceived",
    "OmnistreamsEngine",
    "OmnistreamsRecord",
    "decode_metadata",
    "encode_metadata",
]

CAPABILITIES = Capabilities(
    names=True,
    credit="messages",
    ping=False,
    half_close=False,
    reset_message=False,
    one_way=True,
    message_transport=True,
    acceptance=False,
    controls=True,
)
"""omnistreams (both numberings): one-way streams named in their creation metadata, a
credit of messages, control messages, and one message per frame over WebSocket."""

_S = ChannelState
_I = Input
_READERS = (_S.OFFERED_REMOTE, _S.OFFERED_REMOTE_ENDED, _S.HALF_CLOSED_LOCAL, _S.CLOSING)

TRANSITIONS = Transitions(
    {
        # A stream we write: the peer never writes on it.
        (_S.IDLE, _I.OPEN): _S.HALF_CLOSED_REMOTE,
        (_S.HALF_CLOSED_REMOTE, _I.SEND): _S.HALF_CLOSED_REMOTE,
        (_S.HALF_CLOSED_REMOTE, _I.END): _S.CLOSED,  # STREAM_END
        (_S.HALF_CLOSED_REMOTE, _I.RESET): _S.CLOSED,  # CANCEL_RECEIVE (legacy: STREAM_END)
        (_S.HALF_CLOSED_REMOTE, _I.RECV_RESET): _S.CLOSED,  # CANCEL_SEND
        # A stream we read: we never write on it.
        (_S.IDLE, _I.RECV_OPEN): _S.OFFERED_REMOTE,
        (_S.OFFERED_REMOTE, _I.ACCEPT): _S.HALF_CLOSED_LOCAL,  # STREAM_REQUEST_DATA
        # Ended before we took it: kept until the output is next collected.
        (_S.OFFERED_REMOTE_ENDED, _I.ACCEPT): _S.CLOSING,
        (_S.OFFERED_REMOTE, _I.REJECT): _S.CLOSED,  # CANCEL_SEND
        (_S.OFFERED_REMOTE_ENDED, _I.REJECT): _S.CLOSED,
        (_S.HALF_CLOSED_LOCAL, _I.RECV_DATA): _S.HALF_CLOSED_LOCAL,
        (_S.OFFERED_REMOTE, _I.RECV_DATA): Refuse(
            "STREAM_DATA on {channel} before any STREAM_REQUEST_DATA", FlowControlError
        ),
        (_S.OFFERED_REMOTE, _I.RECV_END): _S.OFFERED_REMOTE_ENDED,
        (_S.HALF_CLOSED_LOCAL, _I.RECV_END): _S.CLOSED,
        (_S.OFFERED_REMOTE, _I.RECV_RESET): _S.CLOSED,  # CANCEL_RECEIVE
        (_S.HALF_CLOSED_LOCAL, _I.RECV_RESET): _S.CLOSED,
        # Ending or resetting a stream we read cancels it (CANCEL_SEND).
        **{(s, _I.END): _S.CLOSED for s in _READERS},
        **{(s, _I.RESET): _S.CLOSED for s in _READERS},
    },
    {_I.SEND: "{channel} is receive-only"},
)
"""omnistreams' stream states. Streams are one-way: ours start half-closed on the peer's
side, and theirs are half-closed on ours once accepted; a stream that ended before we
accepted it closes when accepted. Data before our first STREAM_REQUEST_DATA is a flow
control error."""


@dataclass(slots=True, eq=False)
class OmnistreamsRecord(ChannelRecord):
    """A stream's record with omnistreams' own fields."""

    send: MessageCredit
    recv: MessageWindow | None
    chunk: int = 0
    """The largest STREAM_DATA payload on the stream (its announced ``chunkSize``)."""
    metadata: bytes = b""
    """The creation metadata as sent on the wire."""
    meta: dict[str, Any] | None = None
    """The creation metadata as a JSON object (None: opaque bytes)."""


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


class OmnistreamsEngine(Engine[OmnistreamsRecord]):
    """One side of an omnistreams connection.

    Args:
        config: ``receive_window`` (bytes; the message credit a reader grants is
            ``receive_window // chunkSize``), ``send_frame`` (our chunk size, capped by
            ``max_message_size - 2``), ``max_message_size`` (largest message accepted,
            default 1 MiB + 2) and, kept for compatibility, ``omnistreams_numbering``.
        numbering: ``"spec"`` (the default) or ``"legacy"``; overrides the config's.
        message_mode: True when the transport keeps message boundaries (WebSocket).
    """

    _tables = (TRANSITIONS, TRANSITIONS)

    def __init__(
        self, config: SessionConfig | None = None, *, numbering: str | None = None, message_mode: bool = False
    ) -> None:
        super().__init__(CAPABILITIES)
        self.config = config = config or SessionConfig()
        name = numbering or config.omnistreams_numbering or "spec"
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
        self._cancelled: set[int] = set()  # peer ids we cancelled: stale messages are dropped
        self._ended: set[int] = set()  # peer ids that ended and were not created again
        self._codes = {kind: self.numbering.codes.get(kind) for kind in Kind}
        self._lingering: list[OmnistreamsRecord] = []  # accepted after their END: forgotten soon

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
                self._forget(record)
            self._lingering.clear()
        return super().data_to_send()

    def _emit(self, kind: Kind, stream_id: int | None, payload: BytesLike = b"") -> None:
        code = self._codes[kind]
        if code is None:  # pragma: no cover - legacy lacks only CANCEL_RECEIVE: _send_reset checks
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

    def heartbeat(self) -> bool:
        """A request for 0 messages (REQUEST_DATA, stream 0), which receivers ignore; only
        over byte streams, whose length prefix is polymux's own (a WebSocket pings)."""
        if self.message_mode:
            return False
        self._emit(Kind.REQUEST_DATA, 0, b"\x00")
        return True

    # -- receiving ----------------------------------------------------------------------------

    def _receive(self, data: bytes, runs: DataRuns) -> None:
        if self._decoder is None:
            if len(data) > self.max_message:
                raise self._error(f"{len(data)}-byte message exceeds max_message_size={self.max_message}")
            self._on_message(wire.decode(data, self.numbering), runs)
        else:
            for raw in self._decoder.feed(data):
                self._on_message(wire.decode(raw, self.numbering), runs)

    def _failed(self, exc: ProtocolError) -> ProtocolError:
        # The codec names the spec's format; the legacy numbering is a format of its own.
        return exc if exc.format == self.format else ProtocolError(self.format, exc.detail)

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """From the length prefixes; over a message transport there is nothing to cut."""
        return start if self._decoder is None else self._decoder.whole_frames(data, start, most)

    def _unfinished_input(self) -> tuple[int, str]:
        return (self._decoder.pending if self._decoder is not None else 0), "length-prefixed message"

    def _on_message(self, message: wire.Message, runs: DataRuns) -> None:
        kind, sid, payload = message
        by_wire = self._by_wire
        if kind is Kind.DATA:
            assert sid is not None
            record = by_wire.get((False, sid))
            if record is None:
                self._on_stray(sid, "STREAM_DATA")
                return
            n = len(payload)
            if n > record.chunk:
                raise self._error(
                    f"STREAM_DATA of {n} bytes on {record.describe()} exceeds its chunkSize {record.chunk}"
                )
            if record.state not in TRANSITIONS.receiving:
                self._step(record, Input.RECV_DATA)  # refused: no credit was granted yet
            recv = record.recv
            assert recv is not None
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
        events = runs.events
        if kind is Kind.CONTROL:
            events.append(ControlReceived(bytes(payload)))
        elif kind is Kind.CREATE:
            assert sid is not None
            self._on_create(sid, payload, events)
        elif kind is Kind.END:
            assert sid is not None
            record = by_wire.get((False, sid))
            if record is None:
                self._on_stray(sid, "STREAM_END")  # returns only for an id we cancelled
                self._cancelled.discard(sid)  # the sender ended it before our cancel arrived
                self._ended.add(sid)
                return
            self._ended.add(sid)
            if self._step(record, Input.RECV_END) is not ChannelState.CLOSED:
                # Created and ended within one read: kept until the I/O layer accepts (or
                # rejects) the offer it has not seen yet, so the empty stream is not lost;
                # its id is the peer's to create again.
                del by_wire[(False, sid)]
            events.append(ChannelEnded(record.handle))
            events.append(ChannelClosed(record.handle))
        elif kind is Kind.CANCEL_RECEIVE:
            assert sid is not None
            record = by_wire.get((False, sid))
            self._cancelled.discard(sid)
            if record is not None:
                self._step(record, Input.RECV_RESET)
                events.append(ChannelReset(record.handle, "cancelled by the sender"))
        elif kind is Kind.REQUEST_DATA:
            assert sid is not None
            record = by_wire.get((True, sid))
            count = payload[0]
            if count == 0:
                self.peer_heartbeats += 1  # (we never request 0 messages: heartbeat())
                return
            if record is None:
                return  # a request racing with our end or cancel
            record.send.grow(count)
            events.append(CreditAvailable(record.handle))
        else:  # CANCEL_SEND
            assert sid is not None
            record = by_wire.get((True, sid))
            if record is not None:
                self._step(record, Input.RECV_RESET)
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
        if (False, sid) in self._by_wire:
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
        granted = sum(r.recv.window * r.send.chunk for r in self._channels.values() if r.recv is not None)
        window = message_window(
            budget_window(config.receive_window, config.max_session_memory, granted), chunk
        )
        record = self._create(
            OmnistreamsRecord,
            sid,
            local=False,
            name=name,
            send=MessageCredit(chunk),
            recv=MessageWindow(window, max(1, window // 4)),
            chunk=chunk,
            metadata=raw,
            meta=meta,
        )
        if len(raw) > config.max_name_bytes:
            self.reject_channel(record.handle)  # metadata beyond max_name_bytes: refused
            return
        events.append(ChannelOpened(record.handle, name))

    # -- commands -----------------------------------------------------------------------------

    def open_channel(self, name: str = "", *, extra: Mapping[str, Any] | None = None) -> int:
        """Create a stream we write (CREATE_RECEIVE_STREAM with ``name``, our ``chunkSize``
        and the ``extra`` keys as metadata). It has no credit until the peer requests data.
        Raises ``RuntimeError`` when all 256 ids are in use, ``ValueError`` (and holds nothing)
        when the metadata does not fit in a message of ``max_message_size``."""
        if not self._free_ids:
            raise RuntimeError(f"{self.format}: all 256 stream ids are in use")
        sid = self._free_ids[0]
        metadata = encode_metadata(name, self.chunk_size, extra)
        self._emit(Kind.CREATE, sid, metadata)  # first: metadata too long raises, nothing held
        self._free_ids.popleft()
        record = self._create(
            OmnistreamsRecord,
            sid,
            local=True,
            name=name,
            send=MessageCredit(self.chunk_size),
            chunk=self.chunk_size,
            metadata=metadata,
            meta=decode_metadata(metadata),
        )
        return record.handle

    def _on_accept(self, record: OmnistreamsRecord) -> None:
        """Taking an incoming stream: grant its initial credit (REQUEST_DATA)."""
        if record.state is ChannelState.CLOSING:
            # It ended before we took it: nothing to request. Its metadata stays readable
            # until the output is next collected (the I/O layer is still wiring it up).
            self._lingering.append(record)
            return
        recv = record.recv
        assert recv is not None
        for count in split_count(recv.window):
            self._emit(Kind.REQUEST_DATA, record.wire_id, bytes((count,)))

    def _on_reject(self, record: OmnistreamsRecord, previous: ChannelState) -> None:
        """Refusing an incoming stream: CANCEL_SEND (unless it ended already)."""
        if previous is not ChannelState.OFFERED_REMOTE_ENDED:
            self._cancel(record)

    def send_credit(self, channel: int) -> int:
        """Bytes that fit in the messages the peer still requests (0 on a receive-only stream)."""
        record = self._channels.get(channel)
        if record is None or record.state not in TRANSITIONS.sending:
            return 0
        return record.send.available_bytes

    def send_data(self, channel: int, data: BytesLike, *more: BytesLike) -> None:
        """Queue ``data`` (then ``more``) as STREAM_DATA messages of at most ``chunkSize``
        bytes (views; several parts are joined first, since a message is one piece). The
        total must not exceed :meth:`send_credit`."""
        if more:
            data = b"".join((data, *more))
        record = self._writable(channel)
        send = record.send
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
        if channel in self._channels:
            super().end_channel(channel)
        return True

    def _send_end(self, record: OmnistreamsRecord) -> None:
        if record.local_origin:
            self._emit(Kind.END, record.wire_id)
        else:
            self._cancel(record)

    def _send_reset(self, record: OmnistreamsRecord, previous: ChannelState, message: str | None) -> None:
        """Cancel a stream: CANCEL_SEND when we read it; CANCEL_RECEIVE when we write it
        (STREAM_END in the legacy numbering, which has no cancel from the sender)."""
        if not record.local_origin:
            self._cancel(record)
            return
        kind = Kind.CANCEL_RECEIVE if self._codes[Kind.CANCEL_RECEIVE] is not None else Kind.END
        self._emit(kind, record.wire_id)

    credit_estimated = True

    def credit_step(self, channel: int) -> int:
        """In bytes, estimated from the messages held (see
        :meth:`~polymux.engine.flow.MessageWindow.bytes_until_due`)."""
        record = self._channels.get(channel)
        if record is None or record.local_origin:
            return NO_CREDIT_STEP
        recv = record.recv
        assert isinstance(recv, MessageWindow)
        return recv.bytes_until_due()

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
        return self._record(channel).metadata

    def metadata_object(self, channel: int) -> dict[str, Any] | None:
        """The creation metadata of a live stream as a JSON object (``None``: opaque bytes)."""
        return self._record(channel).meta

    def is_sender(self, channel: int) -> bool:
        """True when we write ``channel`` (we opened it), False when we read it."""
        return self._record(channel).local_origin

    @property
    def free_ids(self) -> int:
        """Stream ids still available for streams we open."""
        return len(self._free_ids)

    # -- helpers ------------------------------------------------------------------------------

    def _release(self, record: OmnistreamsRecord) -> None:
        if record.local_origin:
            self._free_ids.append(record.wire_id)

    def _cancel(self, record: OmnistreamsRecord) -> None:
        """Cancel a stream we read (CANCEL_SEND); what is in flight on it is dropped."""
        self._cancelled.add(record.wire_id)
        self._emit(Kind.CANCEL_SEND, record.wire_id)
