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
  response.
* A response starts only after its request ended: no response chunk, data or termination,
  goes on the wire for request N before N's terminating chunk was received. The spec's
  flow is "sender sends request, receiver processes it, receiver sends response", and
  go-streamux fails the session on a response to a request it is still sending ("Cannot
  receive response N: Message has not been completely sent"). So :meth:`send_credit` is 0
  for a response whose request has not ended (the I/O layer keeps its bytes), an
  ``end_channel`` or reset of such a response is sent when the request ends, and a
  :class:`~polymux.engine.events.CreditAvailable` says when the response may go.
* Streamux has no credit on the wire, so the bytes of such a held response cannot be made
  to wait by slowing the requester down: the application must go on reading the request
  (an echo handler that blocked in ``drain()`` would stop reading, and the request would
  never end). :meth:`may_hold` lets the I/O layer go on past its usual limits (the asyncio
  layer: the writer past its high-water mark; the anyio one, whose writer waits for
  credit: reading the request past the receive window) and bounds what it holds instead:
  :attr:`StreamuxOptions.response_hold` bytes per response,
  :attr:`StreamuxOptions.hold_budget` for all of a session's held responses; beyond them
  the I/O layer resets the channel.
* The responder has no way to fail a request on the wire: resetting (or rejecting) a
  request drops the rest of it and ends the response (an empty termination, sent once the
  request has ended: the requester reads an empty response).
* :attr:`StreamuxOptions.early_responses` (a polymux extension, off by default) lifts the rule:
  a response may start while its request is still arriving, so one channel can carry a
  conversation (polymux's chat and file-transfer apps). The spec's flow does not allow
  it and go-streamux fails the session on it: only between polymux peers. A polymux
  requester accepts such responses either way.
* No flow control on the wire: the I/O layer's slow-reader policy bounds receive buffers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine.base import DataRuns, Engine, run_size
from polymux.engine.channel import HALF_CLOSE, ChannelRecord, ChannelState, Input, Refuse, Transitions
from polymux.engine.events import (
    ChannelClosed,
    ChannelEnded,
    ChannelOpened,
    ChannelReset,
    CreditAvailable,
    Event,
    PingAcked,
    SessionReady,
)
from polymux.engine.flow import SendCredit
from polymux.engine.spec import Capabilities, FormatOptions
from polymux.exceptions import LimitExceeded, ProtocolError
from polymux.wire import streamux as wire


__all__ = ["CAPABILITIES", "StreamuxEngine", "StreamuxOptions", "StreamuxRecord"]

CAPABILITIES = Capabilities(
    names=False,
    credit=None,
    ping=True,
    half_close=True,
    reset_message=False,
    handshake=True,
    conversation_option="streamux_early_responses",
    acceptance=False,
)
"""Streamux: no names, no credit, pings, an initialize message each way; a channel is one
request (half-closed by its end), and carries a conversation only with
:attr:`StreamuxOptions.early_responses`."""

_QUICK_INIT = ("off", "request", "allow")


@dataclass(frozen=True, slots=True)
class StreamuxOptions(FormatOptions):
    """Streamux's own settings (``polymux.formats.get("streamux").configure(...)``). The
    :class:`~polymux.SessionConfig` keywords of older releases (``streamux_id_bits`` ...,
    named in :attr:`legacy`) still set them.

    Raises:
        ValueError: a bit range the initialize message cannot offer, an unknown
            ``quick_init``, a limit that is not a positive int, ``hold_budget`` below
            ``response_hold``.
    """

    legacy: ClassVar[Mapping[str, str]] = {
        "streamux_id_bits": "id_bits",
        "streamux_length_bits": "length_bits",
        "streamux_quick_init": "quick_init",
        "streamux_response_hold": "response_hold",
        "streamux_hold_budget": "hold_budget",
        "streamux_early_responses": "early_responses",
    }

    id_bits: tuple[int, int, int] = (1, 29, 14)
    """Request-id bits we offer: (min, max, recommended; 31 = no preference)."""

    length_bits: tuple[int, int, int] = (6, 30, 16)
    """Chunk-length bits we offer: (min, max, recommended; 31 = no preference)."""

    quick_init: str = "off"
    """Quick init: ``"request"`` (send at once with our recommended values), ``"allow"``
    (accept a peer's request), or ``"off"``."""

    response_hold: int = 64 * 1024 * 1024
    """Bytes one response may hold unsent while its request is still arriving. A response
    goes on the wire only after its request ended (go-streamux rejects anything else), and
    Streamux has no credit to slow the requester down, so a handler that answers as it
    reads (an echo) must keep reading: its ``drain()`` does not block past
    ``write_buffer_high`` until the request ends, up to this many bytes; beyond them the
    channel is reset (the handler gets :class:`~polymux.exceptions.ChannelOverflow` naming
    this limit; the requester reads an empty response, since the responder has no way to
    say that a request failed). Held bytes are counted here and in ``hold_budget``, not in
    ``max_session_memory``: only reading ends a request, so they must never pause
    reading."""

    hold_budget: int = 64 * 1024 * 1024
    """What all the responses of one session may hold that way, together (counted once each
    passes ``write_buffer_high``); the response that passes it is reset. At least
    ``response_hold``. A Streamux session may so hold up to ``max_session_memory`` plus
    this."""

    early_responses: bool = False
    """A polymux extension: answer a request while it is still arriving, so that one
    channel can carry a conversation (polymux's chat and file-transfer servers set it). The
    spec's flow is request, then response, and go-streamux ends the session on a response
    to a request it is still sending: set it only where every peer is polymux (a polymux
    requester accepts early responses either way)."""

    def __post_init__(self) -> None:
        if self.early_responses not in (False, True):
            raise ValueError(f"StreamuxOptions.early_responses must be a bool, got {self.early_responses!r}")
        if self.quick_init not in _QUICK_INIT:
            raise ValueError(
                f"StreamuxOptions.quick_init must be 'off', 'request' or 'allow', got {self.quick_init!r}"
            )
        for name in ("response_hold", "hold_budget"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"StreamuxOptions.{name} must be a positive int, got {value!r}")
        if self.hold_budget < self.response_hold:
            # A per-response limit that the session's budget never lets a response reach
            # is not a limit.
            raise ValueError(
                f"StreamuxOptions.hold_budget ({self.hold_budget}) must be at least "
                f"response_hold ({self.response_hold})"
            )
        try:
            self._init_message().check()
        except ProtocolError as exc:
            raise ValueError(f"invalid streamux settings: {exc.detail}") from None

    def _init_message(self) -> wire.InitMessage:
        """The initialize message these options offer."""
        ids, lengths = self.id_bits, self.length_bits
        return wire.InitMessage(
            quick_request=self.quick_init == "request",
            quick_allowed=self.quick_init == "allow",
            id_min=ids[0],
            id_max=ids[1],
            id_rec=ids[2],
            length_min=lengths[0],
            length_max=lengths[1],
            length_rec=lengths[2],
        )


_S = ChannelState
_I = Input
_RESPONSE_AFTER_END = Refuse("response to request {id} continued after its termination")
_REQUEST_AFTER_END = Refuse("request {id} continued after its termination")

OUR_REQUESTS = Transitions(
    {
        **HALF_CLOSE,
        (_S.HALF_CLOSED_REMOTE, _I.RECV_DATA): _RESPONSE_AFTER_END,
        (_S.HALF_CLOSED_REMOTE, _I.RECV_END): _RESPONSE_AFTER_END,
    }
)
"""The states of a request we make (we write the request, the peer the response): the
common half-close life; reset is a cancel; nothing may follow the response's termination."""

SERVED_REQUESTS = Transitions(
    {
        **HALF_CLOSE,
        # Rejecting or resetting drops the rest of the request and ends the response (an
        # empty termination, sent once the request has ended): Streamux cannot say why. A
        # request is one message, so it may be rejected even once taken: the same drop.
        **{
            (state, command): outcome
            for command in (_I.REJECT, _I.RESET)
            for state, outcome in (
                (_S.OFFERED_REMOTE, _S.HALF_CLOSED_LOCAL),
                (_S.OFFERED_REMOTE_ENDED, _S.CLOSED),
                (_S.OPEN, _S.HALF_CLOSED_LOCAL),
                (_S.HALF_CLOSED_LOCAL, _S.HALF_CLOSED_LOCAL),
                (_S.HALF_CLOSED_REMOTE, _S.CLOSED),
            )
        },
        (_S.HALF_CLOSED_REMOTE, _I.RECV_DATA): _REQUEST_AFTER_END,
        (_S.OFFERED_REMOTE_ENDED, _I.RECV_DATA): _REQUEST_AFTER_END,
        (_S.HALF_CLOSED_REMOTE, _I.RECV_END): _REQUEST_AFTER_END,
        (_S.OFFERED_REMOTE_ENDED, _I.RECV_END): _REQUEST_AFTER_END,
    }
)
"""The states of a request we serve (the peer writes the request, we the response): the
common half-close life (the peer's reset is its cancel), except that rejecting or resetting
it only ends our side until the request has ended, and nothing may follow the request's
termination."""


@dataclass(slots=True, eq=False)
class StreamuxRecord(ChannelRecord):
    """A request's record with Streamux's own fields (those of requests we serve)."""

    dropped: bool = False
    """Rejected or reset: the rest of the request is dropped, unseen by the application."""
    held: int = 0
    """Bytes the I/O layer holds for the response while the request goes on (:meth:`StreamuxEngine.may_hold`)."""
    end_held: bool = False
    """The response ended before the request: its termination goes out when the request ends."""
    waiting: bool = False
    """The response was refused credit before the request ended: a CreditAvailable follows its end."""


class StreamuxEngine(Engine[StreamuxRecord]):
    """One side of a Streamux session.

    Args:
        config: ``send_frame`` and the session's limits.
        random_id: the first request id (unpredictable by default; fixed in tests).
        options: Streamux's own settings; by default :class:`StreamuxOptions` with what
            ``config`` sets of their legacy keywords.
    """

    format = "streamux"
    _tables = (SERVED_REQUESTS, OUR_REQUESTS)

    def __init__(
        self,
        config: SessionConfig | None = None,
        *,
        random_id: int | None = None,
        options: StreamuxOptions | None = None,
    ) -> None:
        super().__init__(CAPABILITIES)
        self.config = config or SessionConfig()
        self.options = options = options if options is not None else StreamuxOptions().merged(config)
        """Streamux's own settings."""
        self.ours = options._init_message()
        self.theirs: wire.InitMessage | None = None
        self.negotiated: wire.Negotiated | None = None
        self.max_frame = 1
        self._decoder: wire.Decoder | None = None
        self._init_buf = bytearray()
        self._random_id = random_id
        self._locked: set[int] = set()
        self._pings: dict[int, float] = {}
        self._next_id = 0
        self.now = 0.0
        self.rtt: float | None = None
        self.held_bytes = 0
        """Bytes held for responses that wait for their requests' end (unsent, or unread),
        as the I/O layer last reported them (:meth:`may_hold`), summed over the session."""
        self._early = options.early_responses  # polymux-only conversations: no hold
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

    def _receive(self, data: bytes, runs: DataRuns) -> None:
        # Data chunks (and the pieces of streamed bodies) of one channel in a row are one
        # run: one DataReceived, one feed and wake-up (a 64 KiB chunk straddling two reads
        # was 1.6 events a chunk, each a full pass through the session core and the driver).
        events = runs.events
        if self.theirs is None:
            need = wire.INIT_SIZE - len(self._init_buf)
            self._init_buf += data[:need]
            data = data[need:]
            if len(self._init_buf) < wire.INIT_SIZE:
                return
            self._on_init(wire.decode_init(self._init_buf), events)
        if data:
            assert self._decoder is not None
            for cid, response, termination, payload in self._decoder.feed(data):
                if response:
                    self._on_response(cid, termination, payload, runs)
                else:
                    self._on_request(cid, termination, payload, runs)

    def _on_init(self, theirs: wire.InitMessage, events: list[Event]) -> None:
        self.theirs = theirs
        n = wire.negotiate(self.ours, theirs)
        if self.negotiated is None:
            self._set_negotiated(n)
            events.append(SessionReady())
        elif n != self.negotiated:  # pragma: no cover - negotiate() gives a quick requester its own bits
            raise self._error(f"quick init assumed {self.negotiated}, negotiation gave {n}")

    def whole_frames(self, data: BytesLike, start: int, most: int) -> int:
        """From the chunk headers, once the peer's initialize message is in."""
        return (
            start
            if self.theirs is None or self._decoder is None
            else self._decoder.whole_frames(data, start, most)
        )

    def _unfinished_input(self) -> tuple[int, str]:
        pending = self._decoder.pending if self._decoder else 0
        return pending + (len(self._init_buf) if self.theirs is None else 0), "chunk"

    def _on_request(self, cid: int, termination: bool, payload: BytesLike, runs: DataRuns) -> None:
        n = len(payload)
        record = self._by_wire.get((False, cid))
        events = runs.events
        if n == 0 and not termination:  # cancel
            if record is not None:
                self._step(record, Input.RECV_RESET)
                if not record.dropped:
                    runs.flush()
                    events.append(ChannelReset(record.handle, "request cancelled by the peer"))
            self._chunk(cid, 0, response=True, termination=False)  # cancel ack, always
            return
        if record is None:
            if n == 0:  # an empty message: a ping
                self.peer_pings += 1
                self._chunk(cid, 0, response=True, termination=True)
                return
            record = self._new_record(cid, local=False)
            runs.flush()
            events.append(ChannelOpened(record.handle, record.name))
        if n:
            self._step(record, Input.RECV_DATA)  # (refused after the request's termination)
            if not record.dropped:
                runs.add(record, payload, n)
        if termination:
            runs.flush()
            self._remote_ended(record, events)

    def _on_response(self, cid: int, termination: bool, payload: BytesLike, runs: DataRuns) -> None:
        n = len(payload)
        events = runs.events
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
            runs.flush()
            events.append(PingAcked(cid))
            return
        record = self._by_wire.get((True, cid))
        if record is None:
            raise self._error(f"response to request {cid}, which we never sent (or already completed)")
        if n:
            self._step(record, Input.RECV_DATA)  # (refused after the response's termination)
            runs.add(record, payload, n)
        if termination:
            runs.flush()
            self._remote_ended(record, events)

    def _remote_ended(self, record: StreamuxRecord, events: list[Event]) -> None:
        state = self._step(record, Input.RECV_END)
        waiting = False
        if not record.local_origin:
            # The request ended: its response may go on the wire from now on.
            self._release_hold(record)
            if record.end_held:
                record.end_held = False
                self._chunk(record.wire_id, 0, response=True, termination=True)
            waiting, record.waiting = record.waiting, False
        if record.dropped:
            return
        events.append(ChannelEnded(record.handle))
        closed = state is ChannelState.CLOSED
        if waiting and not closed:
            events.append(CreditAvailable(record.handle))
        if closed:
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
            if (True, cid) not in self._by_wire and cid not in self._locked and cid not in self._pings:
                return cid
        raise RuntimeError(f"{self.format}: all {count} request ids are in flight ({n.id_bits}-bit ids)")

    def open_channel(self, name: str = "", *, extra: Mapping[str, Any] | None = None) -> int:
        """Start a request (its chunks go out as the application writes)."""
        record = self._new_record(self._allocate_id(), local=True, name=name)
        return record.handle

    def _on_reject(self, record: StreamuxRecord, previous: ChannelState) -> None:
        """Refusing a request: the rest of it is dropped, and it gets an empty response once
        it has ended."""
        self._drop(record, previous)

    def send_credit(self, channel: int) -> int:
        """Unlimited (no credit on the wire), except 0 for a response whose request has not
        ended yet (see the module docstring)."""
        record = self._channels.get(channel)
        if record is None or record.state not in self._tables[record.local_origin].sending:
            return 0
        if not record.local_origin and not record.remote_end and not self._early:
            record.waiting = True  # a CreditAvailable follows the request's end
            return 0
        return record.send.available

    def may_hold(self, channel: int, held: int) -> bool:
        """True for a request we serve that has not ended, whose response has not ended
        either: neither its writer nor the connection's reading may wait (see the module
        docstring). ``held`` (what the I/O layer holds for it: the unsent response, or
        the unread request) counts against :attr:`StreamuxOptions.response_hold` and,
        summed over the session, :attr:`StreamuxOptions.hold_budget`, beyond which
        :class:`~polymux.exceptions.LimitExceeded` is raised (and the bytes are no longer
        counted: the channel is to be reset)."""
        record = self._channels.get(channel)
        if record is None or record.local_origin or record.remote_end or record.local_end or self._early:
            return False
        options = self.options
        total = self.held_bytes - record.held + held
        problem = None
        if held > options.response_hold:
            problem = (
                f"{held} bytes exceed streamux_response_hold={options.response_hold} "
                "(raise it, or read the whole request before answering)"
            )
        elif total > options.hold_budget:
            problem = (
                f"{total} bytes held by the session's responses exceed "
                f"streamux_hold_budget={options.hold_budget} (raise it)"
            )
        if problem is not None:
            self._release_hold(record)
            raise LimitExceeded(
                f"{self.format}: the response to request {record.wire_id} cannot be sent before the "
                f"request ends, and it holds more while the request is still arriving: {problem}"
            )
        record.held = held
        self.held_bytes = total
        return True

    def send_data(self, channel: int, data: BytesLike, *more: BytesLike) -> None:
        """Queue chunks of at most :attr:`max_frame` bytes (never empty: that is a cancel)."""
        record = self._writable(channel)
        if not record.local_origin and not record.remote_end and not self._early:
            raise RuntimeError(
                f"{self.format}: cannot send the response on {record.describe()} before its request "
                "ended (its send_credit is 0)"
            )
        total = run_size(data, more)
        if total:
            n = self.negotiated
            assert n is not None
            cid, response = record.wire_id, not record.local_origin
            self._queue_frames(
                record, data, more, total, lambda size: wire.encode_header(n, cid, size, response, False)
            )

    def _send_end(self, record: StreamuxRecord) -> None:
        """Terminate our message (an empty termination chunk; a response's waits for the end
        of its request)."""
        if record.local_origin:
            self._chunk(record.wire_id, 0, response=False, termination=True)
        else:
            self._end_response(record)

    def _send_reset(self, record: StreamuxRecord, previous: ChannelState, message: str | None) -> None:
        """Our request: cancel it (the id stays locked until the ack). A request we serve:
        drop the rest of the request and end the response (an empty termination once the
        request has ended; Streamux cannot say why)."""
        if record.local_origin:
            self._chunk(record.wire_id, 0, response=False, termination=False)  # cancel
            self._locked.add(record.wire_id)
        else:
            self._drop(record, previous)

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

    def _drop(self, record: StreamuxRecord, previous: ChannelState) -> None:
        record.dropped = True
        if not previous.local_end:
            self._end_response(record)

    def _end_response(self, record: StreamuxRecord) -> None:
        """Terminate the response to a request we serve: now if the request has ended, else
        when it ends (:meth:`_remote_ended`)."""
        self._release_hold(record)
        if record.remote_end or self._early:
            self._chunk(record.wire_id, 0, response=True, termination=True)
        else:
            record.end_held = True

    def _release_hold(self, record: StreamuxRecord) -> None:
        self.held_bytes -= record.held
        record.held = 0

    def _chunk(self, cid: int, length: int, *, response: bool, termination: bool) -> None:
        assert self.negotiated is not None
        self._out.append(wire.encode_header(self.negotiated, cid, length, response, termination))

    def _new_record(self, cid: int, *, local: bool, name: str = "") -> StreamuxRecord:
        return self._create(StreamuxRecord, cid, local=local, name=name or str(cid), send=SendCredit(None))

    def _release(self, record: StreamuxRecord) -> None:
        self._release_hold(record)
