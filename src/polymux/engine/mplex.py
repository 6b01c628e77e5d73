"""Sans-I/O engine for mplex (libp2p) and multiplex (maxogden): one wire, two dialects.

Rules (libp2p/specs ``mplex/README.md``, maxogden/multiplex ``index.js``, PROTOCOL-NOTES A2):

* A stream is named by its id and by whose it is: frames from a stream's opener carry the
  *initiator* flags (2, 4, 6), frames from the other side the *receiver* flags (1, 3, 5),
  and NewStream (0) always comes from the opener. Each side counts its own ids from 0; we
  never reuse ours, and accept the peer reusing one of its ids once that stream is gone.
* There is no acceptance: a stream is open as soon as NewStream is sent. Rejecting an
  incoming stream resets it.
* Close is a half-close per direction; both closed = the stream is gone. Reset ends both
  directions at once; ``multiplex`` puts the error text in the reset body (UTF-8), libp2p
  ``mplex`` sends an empty body. A received non-empty body is surfaced either way.
* No flow control on the wire: the I/O layer bounds what it buffers (see
  ``SessionConfig.slow_reader``).
* Frames for a stream that does not exist (never opened, or already reset or closed) are
  ignored, as go-mplex and py-libp2p do: a reset always races with data in flight. A
  NewStream for an id in use, data after the peer's close, and malformed frames are
  protocol errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine.base import DataRuns, Engine, run_size
from polymux.engine.channel import HALF_CLOSE, IGNORE, ChannelRecord, ChannelState, Input, Refuse, Transitions
from polymux.engine.events import ChannelOpened, ChannelReset, Event
from polymux.engine.flow import SendCredit
from polymux.engine.spec import Capabilities
from polymux.wire import mplex as wire
from polymux.wire.mplex import Flag


__all__ = [
    "CAPABILITIES",
    "HEARTBEAT_STREAM",
    "MAX_MESSAGE_SIZES",
    "MULTIPLEX_MAX_MESSAGE_SIZE",
    "MplexEngine",
]

HEARTBEAT_STREAM = 2**31 - 1
"""The stream id of our heartbeats (a reset from its initiator, :meth:`MplexEngine.heartbeat`):
one of our ids that we never open (ours count up from 0), below 2^53 (JavaScript's numbers)."""

MULTIPLEX_MAX_MESSAGE_SIZE = 16 * 1024 * 1024
"""Default frame limit of the ``multiplex`` dialect (its npm package sends a write of any
size as one frame and sets no limit)."""

MAX_MESSAGE_SIZES = {"mplex": wire.MAX_MESSAGE_SIZE, "multiplex": MULTIPLEX_MAX_MESSAGE_SIZE}
"""Each dialect's default frame limit (``SessionConfig.max_message_size`` of ``None``)."""

CAPABILITIES = {
    "mplex": Capabilities(
        names=True, credit=None, ping=False, half_close=True, reset_message=False, acceptance=False
    ),
    "multiplex": Capabilities(
        names=True, credit=None, ping=False, half_close=True, reset_message=True, acceptance=False
    ),
}
"""What each dialect carries: multiplex's resets carry the error text, libp2p mplex's none."""

_S = ChannelState
_AFTER_CLOSE = Refuse("data for {channel} after the peer closed it")

TRANSITIONS = Transitions(
    {
        **HALF_CLOSE,
        (_S.HALF_CLOSED_REMOTE, Input.RECV_DATA): _AFTER_CLOSE,
        (_S.OFFERED_REMOTE_ENDED, Input.RECV_DATA): _AFTER_CLOSE,
        (_S.HALF_CLOSED_REMOTE, Input.RECV_END): IGNORE,  # a repeated close changes nothing
        (_S.OFFERED_REMOTE_ENDED, Input.RECV_END): IGNORE,
    }
)
"""mplex's channel states: the common half-close life (no acceptance on the wire; rejecting
is a reset), data after the peer's close is an error, a repeated close is ignored."""

# Flags by who sends them: (message, close, reset).
_AS_INITIATOR = (Flag.MESSAGE_INITIATOR, Flag.CLOSE_INITIATOR, Flag.RESET_INITIATOR)
_AS_RECEIVER = (Flag.MESSAGE_RECEIVER, Flag.CLOSE_RECEIVER, Flag.RESET_RECEIVER)


class MplexEngine(Engine[ChannelRecord]):
    """One side of an mplex / multiplex connection.

    Args:
        dialect: ``"mplex"`` (libp2p: empty reset bodies) or ``"multiplex"`` (maxogden:
            reset bodies carry the error text).
        config: ``max_message_size`` bounds received frames (default 1 MiB for mplex,
            16 MiB for multiplex); sent frames are at most ``min(that, send_frame)`` bytes.
    """

    _tables = (TRANSITIONS, TRANSITIONS)

    def __init__(self, dialect: str = "mplex", config: SessionConfig | None = None) -> None:
        if dialect not in CAPABILITIES:
            raise ValueError(f"unknown mplex dialect {dialect!r}")
        super().__init__(CAPABILITIES[dialect])
        self.format = dialect
        self.config = config or SessionConfig()
        limit = self.config.max_message_size
        if limit is None:
            limit = MAX_MESSAGE_SIZES[dialect]
        self.max_message_size = limit
        self.max_frame = min(limit, self.config.send_frame)
        self._decoder = wire.Decoder(limit, dialect)
        self._next_id = 0

    @property
    def ready(self) -> bool:
        """Always: mplex has no handshake."""
        return True

    @property
    def inbound_count(self) -> int:
        """Streams the peer opened that are still live."""
        return sum(1 for r in self._channels.values() if not r.local_origin)

    @property
    def outbound_count(self) -> int:
        """Streams we opened that are still live."""
        return sum(1 for r in self._channels.values() if r.local_origin)

    # -- receiving ---------------------------------------------------------------------------

    def _receive(self, data: bytes, runs: DataRuns) -> None:
        by_wire = self._by_wire
        receiving = TRANSITIONS.receiving
        for stream_id, flag, body in self._decoder.feed(data):
            if flag == Flag.MESSAGE_INITIATOR or flag == Flag.MESSAGE_RECEIVER:
                # Receiver flags come from the far end of a stream we opened.
                record = by_wire.get((flag == Flag.MESSAGE_RECEIVER, stream_id))
                if record is None:
                    continue  # unknown, or reset/closed: a benign race (documented ignore)
                if record.state not in receiving:
                    self._step(record, Input.RECV_DATA)  # refused: data after the peer's close
                if body:
                    runs.add(record, body, len(body))
                continue
            runs.flush()
            self._on_control(stream_id, flag, body, runs.events)

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """From the frames' varint headers."""
        return self._decoder.whole_frames(data, start, most)

    def _unfinished_input(self) -> tuple[int, str]:
        return self._decoder.pending, "frame"

    def _on_control(self, stream_id: int, flag: int, body: BytesLike, events: list[Event]) -> None:
        if flag == Flag.NEW_STREAM:
            if (False, stream_id) in self._by_wire:
                raise self._error(f"NewStream for stream {stream_id}, which the peer already has open")
            try:
                name = bytes(body).decode()
            except UnicodeDecodeError as exc:
                raise self._error(f"NewStream name of stream {stream_id} is not UTF-8 ({exc})") from None
            new = self._new_record(stream_id, local=False, name=name)
            events.append(ChannelOpened(new.handle, new.name))
            return
        # Receiver flags (odd) concern streams we opened.
        record = self._by_wire.get((flag % 2 == 1, stream_id))
        if record is None:
            if stream_id == HEARTBEAT_STREAM and flag == Flag.RESET_INITIATOR:
                self.peer_heartbeats += 1
            return  # unknown, or already gone: ignored (a race with our reset or close)
        if flag in (Flag.CLOSE_INITIATOR, Flag.CLOSE_RECEIVER):
            self._recv_end(record, events)
        else:  # reset
            text = bytes(body).decode(errors="replace") if body else None
            self._step(record, Input.RECV_RESET)
            events.append(ChannelReset(record.handle, text))

    # -- commands ----------------------------------------------------------------------------

    def open_channel(self, name: str = "", *, extra: Mapping[str, Any] | None = None) -> int:
        """Open a stream (NewStream); it is usable at once."""
        stream_id = self._next_id
        self._next_id += 1
        record = self._new_record(stream_id, local=True, name=name)
        body = name.encode()
        self._out.append(wire.encode_header(stream_id, Flag.NEW_STREAM, len(body)))
        if body:
            self._out.append(body)
        return record.handle

    def send_data(self, channel: int, data: BytesLike, *more: BytesLike) -> None:
        """Queue ``data`` as message frames of at most :attr:`max_frame` bytes (views)."""
        record = self._writable(channel)
        total = run_size(data, more)
        if total:
            sid, flag = record.wire_id, self._flags(record)[0]
            self._queue_frames(record, data, more, total, lambda size: wire.encode_header(sid, flag, size))

    def ack_consumed(self, channel: int, n: int) -> None:
        """Nothing to do: mplex has no credit on the wire."""
        return

    def heartbeat(self) -> bool:
        """A reset of a stream of ours that is never opened (:data:`HEARTBEAT_STREAM`):
        every implementation ignores frames for unknown streams."""
        self._out.append(wire.encode_header(HEARTBEAT_STREAM, Flag.RESET_INITIATOR, 0))
        return True

    # -- the wire side of the commands and helpers ---------------------------------------------

    def _on_reject(self, record: ChannelRecord, previous: ChannelState) -> None:
        """Refusing a stream resets it."""
        self._send_reset(record, previous, "stream refused")

    def _send_end(self, record: ChannelRecord) -> None:
        """Half-close (Close flag); the stream is gone once the peer closed too."""
        self._out.append(wire.encode_header(record.wire_id, self._flags(record)[1], 0))

    def _send_reset(self, record: ChannelRecord, previous: ChannelState, message: str | None) -> None:
        """Reset the stream (both directions); multiplex carries ``message``."""
        body = message.encode() if message and self.caps.reset_message else b""
        self._out.append(wire.encode_header(record.wire_id, self._flags(record)[2], len(body)))
        if body:
            self._out.append(body)

    @staticmethod
    def _flags(record: ChannelRecord) -> tuple[Flag, Flag, Flag]:
        return _AS_INITIATOR if record.local_origin else _AS_RECEIVER

    def _new_record(self, stream_id: int, *, local: bool, name: str) -> ChannelRecord:
        # multiplex: an empty name is the id as a string
        return self._create(
            ChannelRecord, stream_id, local=local, name=name or str(stream_id), send=SendCredit(None)
        )
