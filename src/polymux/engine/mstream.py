"""Sans-I/O MultiplexingStream engine (Nerdbank.Streams), protocol versions 1, 2 and 3.

Rules this module follows (from the reference implementation, see PROTOCOL-NOTES A1):

* Channel ids: v1/v2 elect an "odd" party from the handshake's random bytes; it allocates
  1, 3, 5 ... and the other 2, 4, 6 .... v3 has no handshake: each side counts from 1 and
  every frame says whose id it is (``source``, from the sender's perspective).
* Flow control (v2/v3): each side advertises its own receive window in the Offer and the
  OfferAccepted; ``ContentProcessed`` returns credit as a delta once the application has
  consumed a batch. Sending past the peer's window is a protocol error. v1 has none.
* A frame for a channel id that was never allocated is a protocol error. A frame for a
  channel that existed and is gone is ignored (a benign race with a termination), as the
  reference does.
* ChannelTerminated after the peer's ContentWritingCompleted, without an error text, is a
  clean close; otherwise it is a reset that the application sees as an error.
* We never grow windows on request: a ChannelWindowGrowthRequest is answered with our
  current window, which the protocol defines as a refusal.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine.base import DataRuns, Engine, run_size
from polymux.engine.channel import HALF_CLOSE, ChannelRecord, ChannelState, Input, Refuse, Transitions
from polymux.engine.events import (
    ChannelAccepted,
    ChannelClosed,
    ChannelOpened,
    ChannelRejected,
    ChannelReset,
    CreditAvailable,
    Event,
    ReadingStopped,
    SessionReady,
)
from polymux.engine.flow import ReceiveWindow, SendCredit, budget_window, default_ack_threshold
from polymux.engine.spec import Capabilities
from polymux.wire import mstream as wire
from polymux.wire.mstream import ControlCode as C


__all__ = ["CAPABILITIES", "DEFAULT_REMOTE_WINDOW", "HEARTBEAT_CODE", "MStreamEngine", "MStreamRecord"]

HEARTBEAT_CODE = 0x68
"""The control code of our heartbeats (:meth:`MStreamEngine.heartbeat`): unknown to the
format (0-8), under 128 (a signed byte in the JS port's v1 reader)."""

CAPABILITIES = {
    version: Capabilities(
        names=True,
        credit=None if version == 1 else "bytes",
        ping=False,
        half_close=True,
        reset_message=version >= 2,
        handshake=version < 3,
    )
    for version in (1, 2, 3)
}
"""What each major version carries: named offers that wait for their acceptance, and from
v2 a byte window per channel and reset texts; v1 and v2 start with a handshake."""

_S = ChannelState
_I = Input
_EARLY_CONTENT = Refuse("Content for {channel} before it was accepted")
_LATE_CONTENT = Refuse("Content for {channel} after its ContentWritingCompleted")
_SECOND_END = Refuse("second ContentWritingCompleted for {channel}")

TRANSITIONS = Transitions(
    {
        **HALF_CLOSE,
        (_S.IDLE, _I.OPEN): _S.OFFERED_LOCAL,  # an Offer waits for OfferAccepted
        (_S.OFFERED_LOCAL, _I.RECV_ACCEPT): _S.OPEN,
        (_S.OFFERED_LOCAL, _I.RECV_DATA): _EARLY_CONTENT,
        (_S.HALF_CLOSED_REMOTE, _I.RECV_DATA): _LATE_CONTENT,
        (_S.OFFERED_REMOTE_ENDED, _I.RECV_DATA): _LATE_CONTENT,
        (_S.OFFERED_LOCAL, _I.RECV_END): Refuse(
            "ContentWritingCompleted for {channel} before it was accepted"
        ),
        (_S.HALF_CLOSED_REMOTE, _I.RECV_END): _SECOND_END,
        (_S.OFFERED_REMOTE_ENDED, _I.RECV_END): _SECOND_END,
    },
    {
        _I.ACCEPT: "{channel} is not a pending incoming offer",
        _I.REJECT: "{channel} is not a pending incoming offer",
        _I.RECV_ACCEPT: "OfferAccepted for {channel}, which is not our pending offer",
        _I.END: "cannot end {channel} before it is accepted",
    },
)
"""MultiplexingStream's channel states: the common half-close life, but our offers wait for
OfferAccepted (a ChannelTerminated before it is a rejection), nothing of the peer's may
come before that, and data or a second ContentWritingCompleted after the peer's first are
errors. Both sides ended: ChannelTerminated (:meth:`MStreamEngine._on_closed`)."""


@dataclass(slots=True, eq=False)
class MStreamRecord(ChannelRecord):
    """A channel's record with MultiplexingStream's own field."""

    stopped_reading: bool = False
    """The peer sent ContentReadingCompleted: it reads no more, so we send no more."""
    content: bytes | None = None
    """What precedes the payload's length in every Content frame of this channel (v2/v3:
    the array, the code, the channel id and its source), encoded once."""


_CODE_NAMES: dict[int, str] = {
    C.OFFER: "Offer",
    C.OFFER_ACCEPTED: "OfferAccepted",
    C.CONTENT: "Content",
    C.CONTENT_WRITING_COMPLETED: "ContentWritingCompleted",
    C.CHANNEL_TERMINATED: "ChannelTerminated",
    C.CONTENT_PROCESSED: "ContentProcessed",
    C.CONTENT_READING_COMPLETED: "ContentReadingCompleted",
    C.CHANNEL_WINDOW_ADJUST: "ChannelWindowAdjust",
    C.CHANNEL_WINDOW_GROWTH_REQUEST: "ChannelWindowGrowthRequest",
}

DEFAULT_REMOTE_WINDOW = 5 * wire.MAX_PAYLOAD
"""Window assumed for a v2/v3 peer that advertises none (the JS port's default)."""

MAX_WINDOW = 2**32 - 1
"""The largest receive window a peer may advertise; more (2^63 - 1 ...) is a protocol
violation rather than an unlimited licence to send."""

MAX_CHANNEL_ID = 2**53 - 1
"""The largest channel id accepted: every reference can represent it exactly (the JS port
keeps ids in a Number)."""


class MStreamEngine(Engine[MStreamRecord]):
    """One side of a MultiplexingStream connection.

    Args:
        version: protocol major version, 1, 2 or 3.
        config: session limits; ``receive_window`` is what we advertise (v2/v3).
        random: the 16 handshake bytes (v1/v2); random by default, fixed in tests.
    """

    max_frame = wire.MAX_PAYLOAD
    _tables = (TRANSITIONS, TRANSITIONS)

    def __init__(
        self, version: int, config: SessionConfig | None = None, *, random: bytes | None = None
    ) -> None:
        if version not in CAPABILITIES:
            raise ValueError(f"unknown MultiplexingStream version {version!r}")
        super().__init__(CAPABILITIES[version])
        self.version = version
        self.format = wire.format_name(version)
        self.config = config or SessionConfig()
        self._decoder = wire.Decoder(version)
        self._granted = 0  # receive windows of live channels, summed (max_session_memory)
        self._next_local_id = 0  # 0: not ready yet (v1/v2 wait for the handshake)
        self._id_step = 1
        self._max_remote_id = 0
        self._odd: bool | None = None
        if version == 3:
            self._next_local_id = 1
        else:
            self._random = random if random is not None else os.urandom(16)
            self._out.append(wire.encode_handshake(version, self._random))

    # -- public state ----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """True once ids can be allocated (after the handshake for v1/v2)."""
        return self._next_local_id > 0

    @property
    def is_odd(self) -> bool | None:
        """v1/v2: whether we are the odd party (``None`` before the handshake and in v3)."""
        return self._odd

    # -- receiving ---------------------------------------------------------------------------

    def _receive(self, data: bytes, runs: DataRuns) -> None:
        by_wire = self._by_wire
        receiving = TRANSITIONS.receiving
        v3 = self.version == 3
        odd = 1 if self._odd else 0
        for item in self._decoder.feed(data):
            # Fast path: Content for a live channel that may receive.
            if item.__class__ is wire.Frame and item.code == C.CONTENT and self._next_local_id:
                cid = item.channel_id
                if v3:
                    local = item.source == -1
                    record = by_wire.get((local, cid)) if item.source else None
                else:
                    record = by_wire.get((cid & 1 == odd, cid)) if cid else None
                if record is not None and record.state in receiving:
                    payload = item.payload
                    n = len(payload)
                    if record.recv is not None and not record.recv.received(n):
                        raise self._overrun(record, n)
                    if n:
                        runs.add(record, payload, n)
                    continue
            runs.flush()
            if isinstance(item, wire.Handshake):
                self._on_handshake(item, runs.events)
                odd = 1 if self._odd else 0
            else:
                self._on_frame(item, runs.events)

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """From the frames' headers, once the handshake is in."""
        return self._decoder.whole_frames(data, start, most)

    def _unfinished_input(self) -> tuple[int, str]:
        return self._decoder.pending, "frame" if self.ready else "handshake"

    def _on_handshake(self, hs: wire.Handshake, events: list[Event]) -> None:
        if hs.version[0] != self.version:
            raise self._error(
                f"handshake field version is {hs.version[0]}.{hs.version[1]}, expected {self.version}.x"
            )
        if hs.random == self._random:
            raise self._error("handshake random bytes equal ours; cannot elect the odd party")
        self._odd = self._random > hs.random
        self._next_local_id = 1 if self._odd else 2
        self._id_step = 2
        events.append(SessionReady())

    def _key(self, frame: wire.Frame) -> tuple[bool, int]:
        """Map a frame's channel id to ``(local_origin, wire id)``."""
        cid = frame.channel_id
        if cid is None:
            raise self._error(f"frame with code {frame.code} has no channel id")
        if cid > MAX_CHANNEL_ID:
            raise self._error(f"frame with code {frame.code} for channel id {cid}, beyond {MAX_CHANNEL_ID}")
        if self.version == 3:
            if frame.source == wire.ChannelSource.SEEDED:
                raise self._error(f"frame for seeded channel {cid}, but no seeded channels are configured")
            # The sender's "local" is our "remote".
            return frame.source == wire.ChannelSource.REMOTE, cid
        if cid == 0:
            raise self._error("frame for channel id 0, which is reserved")
        return (cid % 2 == 1) == self._odd, cid

    def _was_allocated(self, key: tuple[bool, int]) -> bool:
        local, cid = key
        if local:
            return cid < self._next_local_id
        return cid <= self._max_remote_id

    def _on_frame(self, frame: wire.Frame, events: list[Event]) -> None:
        if (
            not self.ready
        ):  # pragma: no cover - the decoder yields the handshake first, which readies us or raises
            raise self._error("frame received before the handshake")
        code = frame.code
        if code > C.CHANNEL_WINDOW_GROWTH_REQUEST:
            if code == HEARTBEAT_CODE:
                self.peer_heartbeats += 1
            return  # unknown codes are ignored, as the reference does
        key = self._key(frame)
        if code == C.OFFER:
            self._on_offer(key, frame, events)
            return
        record = self._by_wire.get(key)
        if record is None:
            if self._was_allocated(key):
                return  # the channel is gone: a race with its termination
            origin = "our" if key[0] else "the peer's"
            raise self._error(
                f"{_CODE_NAMES[code]} frame for channel {key[1]}, which {origin} side never opened"
            )
        handle = record.handle
        if code == C.CONTENT:
            # Content in a state that receives took _receive's fast path: here the table
            # refuses it (before the acceptance, after the end) and _step raises.
            self._step(record, Input.RECV_DATA)
        elif code == C.CONTENT_PROCESSED:
            self._on_content_processed(record, frame.payload, events)
        elif code == C.OFFER_ACCEPTED:
            self._step(record, Input.RECV_ACCEPT)
            window = self._check_window(
                wire.decode_offer_accepted(self.version, frame.payload), "OfferAccepted"
            )
            if self.version >= 2:
                record.send.window = DEFAULT_REMOTE_WINDOW if window is None else window
            events.append(ChannelAccepted(handle))
        elif code == C.CONTENT_WRITING_COMPLETED:
            self._recv_end(record, events)
        elif code == C.CHANNEL_TERMINATED:
            message = wire.decode_termination(self.version, frame.payload)
            previous = record.state
            self._step(record, Input.RECV_RESET)
            if previous is ChannelState.OFFERED_LOCAL:
                events.append(ChannelRejected(handle))
                return
            # Answer with our own termination, as the references do: the JS port keeps a
            # channel it disposed in its table until the peer's ChannelTerminated arrives.
            self._on_closed(record)
            if message is None and previous.remote_end:
                events.append(ChannelClosed(handle, local_done=previous.local_end))
            else:
                events.append(ChannelReset(handle, message))
        elif code == C.CONTENT_READING_COMPLETED:
            if not record.stopped_reading:
                record.stopped_reading = True
                events.append(ReadingStopped(handle))
        elif code == C.CHANNEL_WINDOW_ADJUST:
            window = self._check_window(
                wire.decode_window_adjust(self.version, frame.payload), "WindowAdjust"
            )
            assert window is not None
            if record.send.set_window(window):
                events.append(CreditAvailable(handle))
        elif code == C.CHANNEL_WINDOW_GROWTH_REQUEST and record.recv is not None and not record.remote_end:
            # Same window back = refusal; we keep memory bounded by receive_window.
            self._send(C.CHANNEL_WINDOW_ADJUST, record, wire.encode_window_adjust(record.recv.window))

    def _on_offer(self, key: tuple[bool, int], frame: wire.Frame, events: list[Event]) -> None:
        local, cid = key
        if local:
            raise self._error(f"Offer for channel {cid}, an id only we may allocate")
        if cid <= self._max_remote_id:
            raise self._error(f"Offer reuses channel id {cid} (highest so far {self._max_remote_id})")
        self._max_remote_id = cid
        name, window = wire.decode_offer(self.version, frame.payload)
        window = self._check_window(window, "Offer")
        record = self._new_record(cid, local=False, name=name, send=SendCredit(self._remote_window(window)))
        events.append(ChannelOpened(record.handle, name))

    def _on_content_processed(self, record: MStreamRecord, payload: BytesLike, events: list[Event]) -> None:
        if self.version == 1:
            raise self._error(f"ContentProcessed for {record.describe()}, but v1 has no flow control")
        n = wire.decode_content_processed(self.version, payload)
        was_blocked = record.send.available == 0
        if not record.send.release(n):
            raise self._error(
                f"ContentProcessed for {record.describe()} acknowledges {n} bytes, "
                f"but only {record.send.in_flight} are in flight"
            )
        if was_blocked and n:
            events.append(CreditAvailable(record.handle))

    # -- commands ----------------------------------------------------------------------------

    def open_channel(self, name: str = "", *, extra: Mapping[str, Any] | None = None) -> int:
        """Offer a channel named ``name``; returns its handle. Requires :attr:`ready`."""
        if not self.ready:
            raise RuntimeError(f"{self.format}: cannot open a channel before the handshake completed")
        cid = self._next_local_id
        self._next_local_id += self._id_step
        record = self._new_record(
            cid, local=True, name=name, send=SendCredit(None if self.version == 1 else 0)
        )
        window = record.recv.window if record.recv is not None else None
        self._send(C.OFFER, record, wire.encode_offer(self.version, name, window))
        return record.handle

    def _on_accept(self, record: MStreamRecord) -> None:
        """Accepting an offer: OfferAccepted, advertising our receive window (v2/v3)."""
        window = record.recv.window if record.recv is not None else None
        self._send(C.OFFER_ACCEPTED, record, wire.encode_offer_accepted(self.version, window))

    def _on_reject(self, record: MStreamRecord, previous: ChannelState) -> None:
        """Rejecting an offer: ChannelTerminated, as the reference does."""
        self._send(C.CHANNEL_TERMINATED, record, b"")

    def send_credit(self, channel: int) -> int:
        """Bytes that may be sent on ``channel`` now (0 when it cannot send, or the peer
        stopped reading it)."""
        record = self._channels.get(channel)
        if record is None or record.stopped_reading:
            return 0
        return super().send_credit(channel)

    def _writable(self, channel: int) -> MStreamRecord:
        record = self._channels.get(channel)
        if record is None or record.state not in self._tables[record.local_origin].sending:
            record = super()._writable(channel)  # raises the table's refusal
        if record.stopped_reading:
            raise RuntimeError(
                f"{self.format}: cannot send on {record.describe()} in state {record.state.value} "
                "(the peer stopped reading it)"
            )
        return record

    def send_data(self, channel: int, data: BytesLike, *more: BytesLike) -> None:
        """Queue Content frames for ``data`` (within the credit), split at
        :attr:`max_frame` bytes. Payloads are views of ``data``, not copies."""
        record = self._writable(channel)
        total = run_size(data, more) if more else len(data)
        record.send.consume(total)
        if total:
            self._queue_frames(record, data, more, total, self._content_header(record))

    def _content_header(self, record: MStreamRecord) -> Callable[[int], bytes]:
        """The header of a Content frame of ``size`` bytes on ``record``, as a function (the
        part before the length encoded once per channel)."""
        if self.version == 1:
            return lambda size: self._header(C.CONTENT, record, size)
        prefix = record.content
        if prefix is None:
            prefix = record.content = wire.content_prefix(
                self.version,
                record.wire_id,
                wire.ChannelSource.LOCAL if record.local_origin else wire.ChannelSource.REMOTE,
            )
        return lambda size: (
            prefix + (bytes((0xC4, size)) if size <= 0xFF else b"\xc5" + size.to_bytes(2, "big"))
        )

    def _send_end(self, record: MStreamRecord) -> None:
        """Ending our writing: ContentWritingCompleted."""
        self._send(C.CONTENT_WRITING_COMPLETED, record, b"")

    def _on_closed(self, record: MStreamRecord) -> None:
        """Both sides ended (or the peer terminated it): ChannelTerminated."""
        self._send(C.CHANNEL_TERMINATED, record, wire.encode_termination(self.version, None))

    def _send_reset(self, record: MStreamRecord, previous: ChannelState, message: str | None) -> None:
        """Resetting: ChannelTerminated, with ``message`` in v2/v3."""
        self._send(C.CHANNEL_TERMINATED, record, wire.encode_termination(self.version, message))

    def ack_consumed(self, channel: int, n: int) -> None:
        """Return credit for consumed bytes, batched (ContentProcessed, v2/v3)."""
        # (None after the peer's ContentWritingCompleted: the JS port fails on a
        # ContentProcessed for a channel it already disposed)
        due = self._credit_due(channel, n)
        if due is not None:
            record, credit = due
            self._send(C.CONTENT_PROCESSED, record, wire.encode_content_processed(credit))

    # -- helpers -----------------------------------------------------------------------------

    def _remote_window(self, window: int | None) -> int | None:
        if self.version == 1:
            return None
        return DEFAULT_REMOTE_WINDOW if window is None else window

    def _check_window(self, window: int | None, what: str) -> int | None:
        if window is not None and window > MAX_WINDOW:
            raise self._error(f"{what} advertises a window of {window} bytes, beyond {MAX_WINDOW}")
        return window

    def _new_record(self, cid: int, *, local: bool, name: str, send: SendCredit) -> MStreamRecord:
        return self._create(
            MStreamRecord, cid, local=local, name=name, send=send, recv=self._new_receive_window()
        )

    def _new_receive_window(self) -> ReceiveWindow | None:
        """The window of a new channel: ``receive_window``, smaller once the session's
        windows fill ``max_session_memory``."""
        if self.version == 1:
            return None
        config = self.config
        window = budget_window(config.receive_window, config.max_session_memory, self._granted)
        self._granted += window
        return ReceiveWindow(window, default_ack_threshold(window, config.ack_min))

    def _header(self, code: int, record: MStreamRecord, length: int) -> bytes:
        source = None
        if self.version == 3:
            source = wire.ChannelSource.LOCAL if record.local_origin else wire.ChannelSource.REMOTE
        return wire.encode_header(self.version, code, record.wire_id, length, source)

    def _send(self, code: int, record: MStreamRecord, payload: BytesLike) -> None:
        out = self._out
        out.append(self._header(code, record, len(payload)))
        if payload:
            out.append(payload)

    def heartbeat(self) -> bool:
        """A frame of an unknown code and no channel: the references' read loops (C#, JS)
        skip unknown codes, as ours does."""
        self._out.append(wire.encode_header(self.version, HEARTBEAT_CODE, None, 0))
        return True

    def _release(self, record: MStreamRecord) -> None:
        if record.recv is not None:
            self._granted -= record.recv.window
