"""Sans-I/O Streamux engine (kstenerud/streamux, 2019-06-04; PROTOCOL-NOTES A4).

Streamux is request/response: a channel is one request. The opener's writes are the
request's chunks (response bit 0), its ``write_eof()`` the termination; the other side's
writes are the response's chunks (response bit 1, same id). The channel is done when both
messages terminated, and the id is free again.

Rules:

* Both peers send their initialize message first; chunk headers can be read only after
  negotiation (:func:`polymux.wire.streamux.negotiate`). A quick-init requester assumes
  its own recommended values and may send at once; a failed negotiation ends the session.
* Request ids are scoped per sender (the response bit inverts the scope), allocated from an
  unpredictable first id and never reused while in flight or locked.
* Cancel (an empty non-final request chunk) locks the id until the cancel ack; response
  chunks for a locked id are discarded. A cancel for a request we do not know is still
  acked. A cancel ack for an id we did not cancel, a response for an unknown request, a
  request continued after its termination and header bits beyond the negotiated widths
  are protocol errors.
* An empty first chunk with termination is a ping and is answered with an empty response
  (the ping ack) without reaching the application; so an empty request gets an empty
  response. The responder has no way to fail a request on the wire: resetting a response
  ends it (empty termination) and drops the rest of the request.
* No flow control on the wire: the I/O layer's slow-reader policy bounds buffers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine.base import Engine, run_size
from polymux.engine.channel import ChannelRecord
from polymux.engine.events import (
    ChannelClosed,
    ChannelEnded,
    ChannelOpened,
    ChannelReset,
    DataReceived,
    Event,
    PingAcked,
    SessionReady,
)
from polymux.engine.flow import SendCredit
from polymux.exceptions import ProtocolError
from polymux.wire import streamux as wire


__all__ = ["StreamuxEngine"]


class StreamuxEngine(Engine):
    """One side of a Streamux session."""

    format = "streamux"
    has_flow_control = False
    needs_acceptance = False
    has_ping = True

    def __init__(self, config: SessionConfig | None = None, *, random_id: int | None = None) -> None:
        super().__init__()
        self.config = config or SessionConfig()
        c = self.config
        self.ours = wire.InitMessage(
            quick_request=c.streamux_quick_init == "request",
            quick_allowed=c.streamux_quick_init == "allow",
            id_min=c.streamux_id_bits[0],
            id_max=c.streamux_id_bits[1],
            id_rec=c.streamux_id_bits[2],
            length_min=c.streamux_length_bits[0],
            length_max=c.streamux_length_bits[1],
            length_rec=c.streamux_length_bits[2],
        )
        try:
            self.ours.check()
        except ProtocolError as exc:
            raise ValueError(f"invalid streamux settings: {exc.detail}") from None
        self.theirs: wire.InitMessage | None = None
        self.negotiated: wire.Negotiated | None = None
        self.max_frame = 1
        self._decoder: wire.Decoder | None = None
        self._init_buf = bytearray()
        self._random_id = random_id
        self._local: dict[int, ChannelRecord] = {}
        self._remote: dict[int, ChannelRecord] = {}
        self._locked: set[int] = set()
        self._pings: dict[int, float] = {}
        self._next_id = 0
        self.now = 0.0
        self.rtt: float | None = None
        self._out.append(wire.encode_init(self.ours))
        if self.ours.quick_request:
            # Quick init: the peer will take our recommended values (or fail).
            self._set_negotiated(wire.Negotiated(*wire.cap_bits(self.ours.id_rec, self.ours.length_rec)))

    @property
    def ready(self) -> bool:
        """True once chunks can be sent (negotiated, or assumed by a quick-init request)."""
        return self.negotiated is not None

    def _set_negotiated(self, n: wire.Negotiated) -> None:
        self.negotiated = n
        self.max_frame = max(1, min(n.max_length, self.config.send_frame))
        self._decoder = wire.Decoder(n, stream_bodies=True)
        rnd = self._random_id if self._random_id is not None else int.from_bytes(os.urandom(4), "big")
        self._next_id = rnd % n.id_count

    # -- receiving ---------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Process bytes from the peer; return the events. Then call :meth:`data_to_send`."""
        if self.closed:
            raise self._error("received data after the session ended")
        events: list[Event] = []
        try:
            if self.theirs is None:
                need = wire.INIT_SIZE - len(self._init_buf)
                self._init_buf += data[:need]
                data = data[need:]
                if len(self._init_buf) < wire.INIT_SIZE:
                    return events
                self._on_init(wire.decode_init(self._init_buf), events)
            if data:
                assert self._decoder is not None
                for cid, response, termination, payload in self._decoder.feed(data):
                    if response:
                        self._on_response(cid, termination, payload, events)
                    else:
                        self._on_request(cid, termination, payload, events)
        except ProtocolError:
            self.closed = True
            raise
        return events

    def _on_init(self, theirs: wire.InitMessage, events: list[Event]) -> None:
        self.theirs = theirs
        n = wire.negotiate(self.ours, theirs)
        if self.negotiated is None:
            self._set_negotiated(n)
            events.append(SessionReady())
        elif n != self.negotiated:
            raise self._error(f"quick init assumed {self.negotiated}, negotiation gave {n}")

    def _unfinished_input(self) -> tuple[int, str] | None:
        pending = (self._decoder.pending if self._decoder else 0) + (
            len(self._init_buf) if self.theirs is None else 0
        )
        return (pending, "chunk") if pending else None

    def _on_request(self, cid: int, termination: bool, payload: BytesLike, events: list[Event]) -> None:
        n = len(payload)
        record = self._remote.get(cid)
        if n == 0 and not termination:  # cancel
            if record is not None:
                self._forget(record)
                if not record.extra.get("dropped"):
                    events.append(ChannelReset(record.handle, "request cancelled by the peer"))
            self._chunk(cid, 0, response=True, termination=False)  # cancel ack, always
            return
        if record is None:
            if n == 0:  # an empty message: a ping
                self._chunk(cid, 0, response=True, termination=True)
                return
            record = self._new_record(cid, local=False)
            events.append(ChannelOpened(record.handle, record.name))
        elif record.remote_end:
            raise self._error(f"request {cid} continued after its termination")
        if n and not record.extra.get("dropped"):
            events.append(DataReceived(record.handle, payload, n))
        if termination:
            self._remote_ended(record, events)

    def _on_response(self, cid: int, termination: bool, payload: BytesLike, events: list[Event]) -> None:
        n = len(payload)
        if n == 0 and not termination:  # cancel ack
            if cid not in self._locked:
                raise self._error(f"cancel ack for request {cid}, which we did not cancel")
            self._locked.discard(cid)
            return
        if cid in self._locked:
            return  # a late response to a cancelled request: discarded
        if cid in self._pings and n == 0 and termination:
            sent = self._pings.pop(cid)
            self.rtt = max(0.0, self.now - sent)
            events.append(PingAcked(cid))
            return
        record = self._local.get(cid)
        if record is None:
            raise self._error(f"response to request {cid}, which we never sent (or already completed)")
        if record.remote_end:
            raise self._error(f"response to request {cid} continued after its termination")
        if n:
            events.append(DataReceived(record.handle, payload, n))
        if termination:
            self._remote_ended(record, events)

    def _remote_ended(self, record: ChannelRecord, events: list[Event]) -> None:
        record.remote_end = True
        if record.extra.get("dropped"):
            if record.local_end:
                self._forget(record)
            return
        events.append(ChannelEnded(record.handle))
        if record.local_end:
            self._forget(record)
            events.append(ChannelClosed(record.handle))

    # -- commands ----------------------------------------------------------------------------

    def _allocate_id(self) -> int:
        n = self.negotiated
        if n is None:
            raise RuntimeError(f"{self.format}: cannot start a request before negotiation")
        count = n.id_count
        for _ in range(count):
            cid = self._next_id
            self._next_id = (cid + 1) % count
            if cid not in self._local and cid not in self._locked and cid not in self._pings:
                return cid
        raise RuntimeError(f"{self.format}: all {count} request ids are in flight ({n.id_bits}-bit ids)")

    def open_channel(self, name: str = "", *, extra: Mapping[str, Any] | None = None) -> int:
        """Start a request (its chunks go out as the application writes)."""
        record = self._new_record(self._allocate_id(), local=True, name=name)
        record.accepted = True
        return record.handle

    def accept_channel(self, channel: int) -> None:
        """Take an incoming request (nothing goes on the wire)."""
        self._record(channel).accepted = True

    def reject_channel(self, channel: int) -> None:
        """Refuse a request: an empty response, and the rest of the request is dropped."""
        self._drop(self._record(channel))

    def send_data(self, channel: int, data: BytesLike, *more: BytesLike) -> None:
        """Queue chunks of at most :attr:`max_frame` bytes (never empty: that is a cancel)."""
        record = self._writable(channel)
        total = run_size(data, more)
        if total:
            n = self.negotiated
            assert n is not None
            cid, response = record.wire_id, not record.local_origin
            self._queue_frames(
                record, data, more, total, lambda size: wire.encode_header(n, cid, size, response, False)
            )

    def end_channel(self, channel: int) -> bool:
        """Terminate our message (an empty termination chunk)."""
        record = self._record(channel)
        if record.local_end:
            return False
        record.local_end = True
        self._chunk(record.wire_id, 0, response=not record.local_origin, termination=True)
        if record.remote_end:
            self._forget(record)
            return True
        return False

    def reset_channel(self, channel: int, message: str | None = None) -> None:
        """Our request: cancel it (the id stays locked until the ack). A request we serve:
        end the response and drop the rest of the request (Streamux cannot say why)."""
        record = self._channels.get(channel)
        if record is None:
            return
        if record.local_origin:
            self._chunk(record.wire_id, 0, response=False, termination=False)  # cancel
            self._locked.add(record.wire_id)
            self._forget(record)
        else:
            self._drop(record)

    def ack_consumed(self, channel: int, n: int) -> None:
        """Nothing to do: no credit on the wire."""
        return

    def ping(self) -> int:
        """Send a ping (an empty request); returns its id, a ``PingAcked`` follows."""
        cid = self._allocate_id()
        self._pings[cid] = self.now
        self._chunk(cid, 0, response=False, termination=True)
        return cid

    # -- helpers -----------------------------------------------------------------------------

    def _drop(self, record: ChannelRecord) -> None:
        record.extra["dropped"] = True
        if not record.local_end:
            record.local_end = True
            self._chunk(record.wire_id, 0, response=True, termination=True)
        if record.remote_end:
            self._forget(record)

    def _chunk(self, cid: int, length: int, *, response: bool, termination: bool) -> None:
        assert self.negotiated is not None
        self._out.append(wire.encode_header(self.negotiated, cid, length, response, termination))

    def _new_record(self, cid: int, *, local: bool, name: str = "") -> ChannelRecord:
        record = ChannelRecord(
            handle=self._new_handle(),
            wire_id=cid,
            local_origin=local,
            name=name or str(cid),
            send=SendCredit(None),
            recv=None,
        )
        self._channels[record.handle] = record
        (self._local if local else self._remote)[cid] = record
        return record

    def _forget(self, record: ChannelRecord) -> None:
        self._channels.pop(record.handle, None)
        table = self._local if record.local_origin else self._remote
        if table.get(record.wire_id) is record:
            del table[record.wire_id]
