"""What every polymux fuzz target shares: deterministic engines, one input -> one run of
a codec or an engine, and the checks each run makes.

Used by the atheris harnesses in this folder (``fuzz_engine.py``, ``fuzz_codec.py``) and
by the hypothesis suite (``tests/fuzz/``), so both test exactly the same thing.

Input layout (one fuzz input = one connection's received bytes)::

    byte 0      control: bit 0 = role (1 client, 0 server),
                bits 1-2 = channels we open once the engine is ready (0-3),
                bits 3-7 = c, the feed piece size: c = 0 everything in one call, else c*c bytes
    bytes 1..   what the peer sent

The checks:

* only the documented exception (:class:`polymux.ProtocolError` and its subclasses) may
  escape ``receive_data``/``receive_eof``/``Decoder.feed``; anything else is a finding;
* after a protocol error the engine is closed and refuses further input with one too;
* memory is input-proportional: the engine tracks at most one channel per input byte, its
  output (replies, credit) is bounded by a constant times the input plus a constant, and
  the decoder holds back at most one frame.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src")
if os.path.isdir(_SRC) and _SRC not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, _SRC)

from polymux import PROTOCOLS
from polymux.config import SessionConfig
from polymux.engine import Engine, events as ev
from polymux.exceptions import LimitExceeded, ProtocolError
from polymux.formats import get as get_format, make_engine


__all__ = [
    "CONFIG",
    "CORPUS",
    "DOCUMENTED",
    "FORMATS",
    "Outcome",
    "control_byte",
    "corpus_inputs",
    "drive_codec",
    "drive_engine",
    "new_engine",
]

FORMATS: tuple[str, ...] = tuple(PROTOCOLS)
"""Every wire format polymux speaks (grows with ``polymux.PROTOCOLS``)."""

DOCUMENTED: tuple[type[BaseException], ...] = (ProtocolError,)
"""The exceptions received bytes may cause (documented on ``Engine.receive_data``)."""

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
"""``corpus/<format>/*.bin``: recorded valid sessions (control byte + received bytes)."""

CONFIG = SessionConfig(
    receive_window=64 * 1024,
    ack_min=1024,
    max_message_size=256 * 1024,
)
"""A config with small windows, so flow-control edges are reachable by short inputs (yamux's
own windows: :data:`YAMUX`)."""

YAMUX = {"max_receive_window": 1024 * 1024, "window_budget": 8 * 1024 * 1024}
"""yamux's own options (``formats.get("yamux").configure(...)``): small, as above."""

STREAMUX = {"quick_init": "allow"}
"""Streamux's own options: a peer's quick init is accepted (the recorded sessions use it)."""

# Bounds of the memory checks, per input byte (generous constants, linear in the input):
# the engine's replies (credit, pong, reset, accept, and what we answer on channels the
# peer opens) are at most a few dozen bytes per frame received. What the harness itself
# sends on the channels it opened is counted apart: up to _SEND bytes (plus a header of
# at most _HEADER) per channel per piece fed, so 1-byte pieces with three open channels
# legitimately produce more than _OUT_PER_BYTE of it per input byte.
_OUT_PER_BYTE = 64
_OUT_CONST = 64 * 1024
_SEND = 16
_HEADER = 64

# Fixed handshake randomness so a run is a pure function of its input. A recorded client
# used _CLIENT_RANDOM and its server _SERVER_RANDOM, so replayed ids keep their parity.
_CLIENT_RANDOM = bytes([0xC0]) * 16
_SERVER_RANDOM = bytes([0x40]) * 16


def new_engine(fmt: str, *, is_client: bool, config: SessionConfig = CONFIG) -> Engine:
    """A deterministic engine for ``fmt`` (fixed handshake random bytes and first id)."""
    if fmt.startswith("mstream-v"):
        from polymux.engine.mstream import MStreamEngine

        return MStreamEngine(int(fmt[-1]), config, random=_CLIENT_RANDOM if is_client else _SERVER_RANDOM)
    if fmt == "streamux":
        from polymux.engine.streamux import StreamuxEngine

        return StreamuxEngine(
            config,
            random_id=1 if is_client else 2,
            options=get_format("streamux").configure(**STREAMUX).options,
        )
    if fmt == "yamux":
        return get_format("yamux").configure(**YAMUX).make_engine(config, is_client=is_client)
    return make_engine(fmt, config, is_client=is_client)


def control_byte(*, is_client: bool, opens: int = 0, chunk: int = 0) -> int:
    """The first byte of an input: role, channels opened when ready, feed chunk size."""
    assert 0 <= opens <= 3 and 0 <= chunk <= 31
    return int(is_client) | opens << 1 | chunk << 3


@dataclass
class Outcome:
    """What one run did (for the hypothesis suite's statistics and assertions)."""

    error: ProtocolError | None = None
    events: int = 0
    sent: int = 0
    max_channels: int = 0


def _pieces(data: bytes, chunk: int) -> Iterator[bytes]:
    chunk *= chunk
    if chunk == 0:
        yield data
        return
    for i in range(0, len(data), chunk):
        yield data[i : i + chunk]


def drive_engine(fmt: str, data: bytes) -> Outcome:
    """Feed ``data`` (control byte + peer bytes) to a fresh engine, reacting to its events
    as the asyncio layer does (accept most offers, reject some, return credit for what
    arrives, answer on the channels it opened, end channels the peer ended). Raises
    ``AssertionError`` on a finding; any undocumented exception propagates."""
    outcome = Outcome()
    if not data:
        return outcome
    ctl, payload = data[0], data[1:]
    is_client = bool(ctl & 1)
    opens = (ctl >> 1) & 3
    chunk = ctl >> 3
    engine = new_engine(fmt, is_client=is_client)
    sent = sum(len(c) for c in engine.data_to_send())
    ours = 0  # what the harness sent on the channels it opened
    pieces = 0
    mine: list[int] = []
    started = False
    pos = 0
    while True:
        if not started and engine.ready:
            # What a session does once the handshake is done: the RTT ping, then our opens.
            started = True
            if type(engine).ping is not Engine.ping:
                engine.ping()
            if engine.can_open:
                for i in range(opens):
                    try:
                        mine.append(engine.open_channel(f"fuzz/{i}"))
                    except (RuntimeError, LimitExceeded):
                        # The peer's settings left fewer ids than we want (Streamux: 1-bit
                        # ids); the asyncio layer reports this as LimitExceeded.
                        break
        if pos >= len(payload):
            break
        # Byte by byte until the handshake is done (so our opens come right after it, as
        # in a recorded session), then in the chosen pieces.
        size = 1 if not started and pos < 64 else chunk * chunk or len(payload) - pos
        piece = payload[pos : pos + size]
        pos += size
        engine.now += 0.25
        try:
            events = engine.receive_data(piece)
        except DOCUMENTED as exc:
            outcome.error = exc  # type: ignore[assignment]
            break
        outcome.events += len(events)
        pieces += 1
        _react(engine, events)
        sent += sum(len(c) for c in engine.data_to_send())
        for handle in mine:
            _answer(engine, handle)
        ours += sum(len(c) for c in engine.data_to_send())
        outcome.max_channels = max(outcome.max_channels, engine.channel_count)
        assert engine.channel_count <= len(payload) + opens, (
            f"{fmt}: {engine.channel_count} channels tracked after {len(payload)} input bytes"
        )
    if outcome.error is None:
        try:
            engine.receive_eof()
        except DOCUMENTED as exc:
            outcome.error = exc  # type: ignore[assignment]
    else:
        assert engine.closed, f"{fmt}: engine not closed after {outcome.error!r}"
        try:
            engine.receive_data(b"\x00")
        except DOCUMENTED:
            pass
        else:
            raise AssertionError(f"{fmt}: engine accepted input after {outcome.error!r}")
    sent += sum(len(c) for c in engine.data_to_send())
    outcome.sent = sent
    assert sent <= _OUT_PER_BYTE * len(payload) + _OUT_CONST, (
        f"{fmt}: {sent} bytes of output for {len(payload)} input bytes"
    )
    assert ours <= pieces * len(mine) * (_SEND + _HEADER), (
        f"{fmt}: {ours} bytes sent on our {len(mine)} channels over {pieces} pieces"
    )
    return outcome


def _react(engine: Engine, events: list[ev.Event]) -> None:
    for event in events:
        if isinstance(event, ev.ChannelOpened):
            if not engine.is_live(event.channel):
                continue
            if event.channel % 4 == 3:
                engine.reject_channel(event.channel)
            else:
                engine.accept_channel(event.channel)
                _answer(engine, event.channel)
        elif isinstance(event, ev.DataReceived):
            if engine.is_live(event.channel):
                engine.ack_consumed(event.channel, event.flow_controlled_length)
        elif (
            isinstance(event, ev.ChannelEnded)
            and engine.is_live(event.channel)
            and not engine._channels[event.channel].local_end
        ):
            if event.channel % 3 == 0:
                engine.reset_channel(event.channel, "fuzz")
            else:
                engine.end_channel(event.channel)


def _answer(engine: Engine, handle: int) -> None:
    """Send a few bytes on ``handle`` if it has credit."""
    credit = engine.send_credit(handle)
    if credit > 0:
        engine.send_data(handle, b"f" * min(credit, _SEND))


def drive_codec(fmt: str, data: bytes) -> int:
    """Feed ``data`` to the format's incremental decoder (and its payload decoders), in
    pieces chosen by the first byte. Returns the number of frames decoded. Only
    :class:`ProtocolError` may escape; the decoder may hold back at most one frame."""
    if not data:
        return 0
    ctl, payload = data[0], data[1:]
    chunk = ctl >> 3
    frames = 0
    decoder, limit = _decoder(fmt, ctl)
    try:
        for piece in _pieces(payload, chunk):
            got = decoder.feed(piece)
            frames += len(got)
            for frame in got:
                _decode_payload(fmt, frame)
            pending = getattr(decoder, "pending", None)
            if pending is None:
                pending = len(getattr(decoder, "_partial", b""))
            assert pending <= limit, f"{fmt}: decoder holds {pending} bytes (bound {limit})"
    except DOCUMENTED:
        pass
    return frames


def _decoder(fmt: str, ctl: int) -> tuple[object, int]:
    if fmt.startswith("mstream-v"):
        from polymux.wire import mstream

        version = int(fmt[-1])
        return mstream.Decoder(version, handshake=bool(ctl & 1)), mstream.MAX_PAYLOAD + 64
    if fmt in ("mplex", "multiplex"):
        from polymux.wire import mplex

        size = 64 * 1024
        return mplex.Decoder(size, fmt=fmt), size + 32
    if fmt == "yamux":
        from polymux.wire import yamux

        size = 256 * 1024
        return yamux.Decoder(size), size + 12
    if fmt == "streamux":
        from polymux.wire import streamux

        n = streamux.Negotiated(*streamux.cap_bits(1 + (ctl >> 1 & 3) * 7, 6 + (ctl >> 1 & 3) * 6))
        return streamux.Decoder(n), n.max_length + n.header_size
    if fmt.startswith("omnistreams"):
        from polymux.wire import omnistreams

        size = 64 * 1024
        numbering = omnistreams.NUMBERINGS["legacy" if fmt.endswith("legacy") else "spec"]
        return _OmniDecoder(omnistreams.LengthPrefixDecoder(size), numbering), size + 4
    if fmt in ("smux", "smux-v2"):
        from polymux.wire import smux

        return smux.Decoder(1 if fmt == "smux" else 2, fmt), smux.HEADER_SIZE + smux.MAX_PAYLOAD
    raise AssertionError(f"no codec harness for {fmt!r}: add one to fuzz/polymux_fuzz.py")


class _OmniDecoder:
    """omnistreams: the length-prefix splitter, then each message's decoder."""

    def __init__(self, splitter: Any, numbering: Any) -> None:
        self.splitter = splitter
        self.numbering = numbering

    @property
    def pending(self) -> int:
        return int(self.splitter.pending)

    def feed(self, data: bytes) -> list[object]:
        from polymux.wire import omnistreams

        return [omnistreams.decode(m, self.numbering) for m in self.splitter.feed(data)]


def _decode_payload(fmt: str, frame: object) -> None:
    """Run the payload decoders a frame would go through (MultiplexingStream messages)."""
    if not fmt.startswith("mstream-v"):
        return
    from polymux.wire import mstream

    version = int(fmt[-1])
    if not isinstance(frame, mstream.Frame):
        return
    code = frame.code
    payload = frame.payload
    if code == mstream.ControlCode.OFFER:
        mstream.decode_offer(version, payload)
    elif code == mstream.ControlCode.OFFER_ACCEPTED:
        mstream.decode_offer_accepted(version, payload)
    elif code == mstream.ControlCode.CONTENT_PROCESSED and version > 1:
        mstream.decode_content_processed(version, payload)
    elif code == mstream.ControlCode.CHANNEL_TERMINATED:
        mstream.decode_termination(version, payload)


def corpus_inputs(fmt: str) -> list[bytes]:
    """The committed corpus files of ``fmt`` (empty when there are none)."""
    folder = os.path.join(CORPUS, fmt)
    if not os.path.isdir(folder):
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out.append(f.read())
    return out


def import_all() -> None:
    """Import every codec and engine module (so a coverage-instrumenting import hook sees
    them: ``make_engine`` imports engines lazily)."""
    import importlib
    import pkgutil

    import polymux.engine
    import polymux.wire

    for package in (polymux.wire, polymux.engine):
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
