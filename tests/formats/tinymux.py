"""tinymux: a format that exists only in the tests, complete enough to run sessions, to be
walked, detected and documented; everything polymux knows of it is its registration
(:data:`TINYMUX`, registered by the test that uses it). What a real format's three
modules would hold (``polymux/wire``, ``polymux/engine``, ``polymux/formats``) is here in
one.

The wire: a 4-byte header, type u8, channel u8, length u16 big-endian, then ``length``
payload bytes. The type is ``0xE0 | kind``, plus ``0x08`` when the sender opened the
channel; kinds: OPEN 0 (the payload is the channel's name), DATA 1, END 2 (a half-close,
no payload), RESET 3 (the payload is the reason). Each side numbers its own channels from
0. No flow control, no pings, no handshake.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from polymux._types import BytesLike
from polymux.config import SessionConfig
from polymux.engine.base import DataRuns, Engine, run_size
from polymux.engine.channel import HALF_CLOSE, IGNORE, ChannelRecord, ChannelState, Input, Refuse, Transitions
from polymux.engine.events import ChannelOpened, ChannelReset, Event
from polymux.engine.flow import SendCredit
from polymux.engine.spec import Capabilities, FormatOptions
from polymux.exceptions import ProtocolError
from polymux.formats import Fit, Format, FormatDocs, Probe, Signature, Walk
from polymux.formats.records import FrameRecord
from polymux.formats.walk import OTHER, PREFIX, Codec


NAME = "tinymux"

# -- the codec -----------------------------------------------------------------------------

HEADER = struct.Struct(">BBH")
MARK = 0xE0
OPENER = 0x08
OPEN, DATA, END, RESET = range(4)
KINDS = ("open", "data", "end", "reset")


class Frame(NamedTuple):
    """One frame: its kind, whether its sender opened the channel, the channel, the body."""

    kind: int
    opener: bool
    channel: int
    body: bytes


def header(kind: int, opener: bool, channel: int, length: int) -> bytes:
    """A frame's header."""
    return HEADER.pack(MARK | kind | (OPENER if opener else 0), channel, length)


class Decoder:
    """Incremental decoding of one direction."""

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buf)

    def feed(self, data: BytesLike) -> list[Frame]:
        """The frames the bytes so far complete."""
        buf = self._buf
        buf += data
        out = []
        while len(buf) >= HEADER.size:
            type_, channel, length = HEADER.unpack_from(buf)
            kind = type_ & 7
            if type_ & 0xF0 != MARK or kind > RESET:
                raise ProtocolError(NAME, f"frame type is {type_:#04x}, not one of tinymux's")
            if kind == END and length:
                raise ProtocolError(NAME, f"END frame length is {length} on channel {channel}, must be 0")
            if len(buf) < HEADER.size + length:
                break
            out.append(Frame(kind, bool(type_ & OPENER), channel, bytes(buf[4 : 4 + length])))
            del buf[: 4 + length]
        return out


# -- the engine ----------------------------------------------------------------------------

CAPABILITIES = Capabilities(
    names=True, credit=None, ping=False, half_close=True, reset_message=True, acceptance=False
)

_AFTER_END = Refuse("data for {channel} after its END")
TRANSITIONS = Transitions(
    {
        **HALF_CLOSE,
        (ChannelState.HALF_CLOSED_REMOTE, Input.RECV_DATA): _AFTER_END,
        (ChannelState.OFFERED_REMOTE_ENDED, Input.RECV_DATA): _AFTER_END,
        (ChannelState.HALF_CLOSED_REMOTE, Input.RECV_END): IGNORE,
        (ChannelState.OFFERED_REMOTE_ENDED, Input.RECV_END): IGNORE,
    }
)


@dataclass(frozen=True, slots=True)
class TinyOptions(FormatOptions):
    """tinymux's own setting."""

    legacy: ClassVar[Mapping[str, str]] = {}

    frame_size: int = 4096
    """The largest frame body we send."""

    def __post_init__(self) -> None:
        if not 0 < self.frame_size <= 0xFFFF:
            raise ValueError(f"TinyOptions.frame_size must be in 1..65535, got {self.frame_size!r}")


class TinyEngine(Engine[ChannelRecord]):
    """One side of a tinymux session."""

    format = NAME
    _tables = (TRANSITIONS, TRANSITIONS)

    def __init__(self, config: SessionConfig | None = None, options: TinyOptions | None = None) -> None:
        super().__init__(CAPABILITIES)
        self.config = config or SessionConfig()
        self.options = options or TinyOptions()
        self.max_frame = self.options.frame_size
        self._decoder = Decoder()
        self._next_id = 0

    @property
    def ready(self) -> bool:
        """No handshake."""
        return True

    def _receive(self, data: bytes, runs: DataRuns) -> None:
        for kind, opener, channel, body in self._decoder.feed(data):
            record = self._by_wire.get((not opener, channel))
            if kind == DATA:
                if record is None:
                    continue
                if record.state not in TRANSITIONS.receiving:
                    self._step(record, Input.RECV_DATA)
                if body:
                    runs.add(record, body, len(body))
                continue
            runs.flush()
            self._control(kind, channel, body, record, runs.events)

    def _control(
        self, kind: int, channel: int, body: bytes, record: ChannelRecord | None, events: list[Event]
    ) -> None:
        if kind == OPEN:
            if (False, channel) in self._by_wire:
                raise self._error(f"OPEN for channel {channel}, which the peer already has open")
            new = self._create(ChannelRecord, channel, local=False, name=body.decode(), send=SendCredit(None))
            events.append(ChannelOpened(new.handle, new.name))
        elif record is None:
            return
        elif kind == END:
            self._recv_end(record, events)
        else:
            self._step(record, Input.RECV_RESET)
            events.append(ChannelReset(record.handle, body.decode(errors="replace") or None))

    def _unfinished_input(self) -> tuple[int, str]:
        return self._decoder.pending, "frame"

    def open_channel(self, name: str = "", *, extra: Mapping[str, Any] | None = None) -> int:
        """Open a channel (OPEN); usable at once."""
        channel = self._next_id
        self._next_id += 1
        record = self._create(ChannelRecord, channel, local=True, name=name, send=SendCredit(None))
        body = name.encode()
        self._out += [header(OPEN, True, channel, len(body)), body]
        return record.handle

    def send_data(self, channel: int, data: BytesLike, *more: BytesLike) -> None:
        """DATA frames of at most ``frame_size`` bytes."""
        record = self._writable(channel)
        total = run_size(data, more)
        if total:
            opener, wire_id = record.local_origin, record.wire_id
            self._queue_frames(record, data, more, total, lambda n: header(DATA, opener, wire_id, n))

    def ack_consumed(self, channel: int, n: int) -> None:
        """No credit on the wire."""

    def _on_reject(self, record: ChannelRecord, previous: ChannelState) -> None:
        self._send_reset(record, previous, "refused")

    def _send_end(self, record: ChannelRecord) -> None:
        self._out.append(header(END, record.local_origin, record.wire_id, 0))

    def _send_reset(self, record: ChannelRecord, previous: ChannelState, message: str | None) -> None:
        body = (message or "").encode()
        self._out += [header(RESET, record.local_origin, record.wire_id, len(body)), body]


# -- the frame-record walk -------------------------------------------------------------------


class TinyWalk(Walk):
    """One record per frame; channels keyed ``c<id>`` / ``s<id>`` by who opened them."""

    def codec(self, direction: str) -> Codec:
        return Decoder()

    def size(self, item: Any) -> int:
        return HEADER.size + len(item.body)

    def payload(self, item: Any) -> Any:
        return item.body

    def records(self, direction: str, item: Any, offset: int, time_ns: int) -> list[FrameRecord]:
        kind, opener, channel, body = item
        key = f"{PREFIX[direction if opener else OTHER[direction]]}{channel}"
        if kind == OPEN:
            self.channel_names[key] = body.decode("utf-8", "replace")
        error = body.decode("utf-8", "replace") if kind == RESET and body else None
        flags = MARK | kind | (OPENER if opener else 0)
        return [self.rec(direction, time_ns, offset, key, KINDS[kind], len(body), flags, error=error)]


# -- the signature and the format ------------------------------------------------------------


def _fits(probe: Probe) -> list[Fit]:
    if not probe.c2s or probe.c2s[0] != MARK | OPENER | OPEN:
        return []
    records = probe.decode(TINYMUX)
    if records is None or records[0].frame_type != "open":
        return []
    return [Fit(NAME, 0.9, "a tinymux OPEN (type byte e8) first")]


def _engine(fmt: Format, config: SessionConfig, is_client: bool, message_mode: bool) -> Engine:
    assert isinstance(fmt.options, TinyOptions)
    return TinyEngine(config, fmt.options)


TINYMUX: Format = Format(
    NAME,
    "tinymux (a test-only format)",
    NAME,
    CAPABILITIES,
    _engine,
    TinyWalk,
    Signature(_fits, rank=60),
    TinyOptions(),
    FormatDocs(
        page="formats/index.md",
        tested_against="tests/formats/test_new_format.py",
        names="in the OPEN frame",
        limits="255 channels per side",
    ),
)
"""The format, to register."""
