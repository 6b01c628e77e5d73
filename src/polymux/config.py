"""Session configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields, replace
from typing import Any, TypedDict

from polymux._types import CaptureFactory


__all__ = ["COMPATIBILITY_FIELDS", "SessionConfig", "SessionOptions", "suggest"]

COMPATIBILITY_FIELDS = (
    "max_receive_window",
    "window_budget",
    "streamux_id_bits",
    "streamux_length_bits",
    "streamux_quick_init",
    "streamux_response_hold",
    "streamux_hold_budget",
    "streamux_early_responses",
    "smux_peer_buffer",
)
"""The fields kept for compatibility that set one format's typed option (its
``FormatOptions.legacy``); on another format they would do nothing, so
:func:`polymux.formats.resolve` refuses them there."""


def suggest(name: str, names: Any) -> str:
    """``"; did you mean 'x'?"`` for the names close to ``name`` (a typo, a prefix:
    ``keepalive`` -> ``keepalive_interval`` or ``keepalive_timeout``), else ``""``."""
    names = sorted(names)
    close = [n for n in names if n.startswith(name)] if len(name) >= 4 else []
    close = close or difflib.get_close_matches(name, names, n=2, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(n) for n in close[:2]) + "?"


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Limits and tuning for one session. Every field has a safe default.

    Pass fields as keyword options to :func:`polymux.connect` and friends, or build one
    and pass ``config=``. Each field, its default and the first sentence of its own
    documentation (the whole of it is under the field in the source, in the API reference
    and in docs/defaults.md)::

        receive_window (1 MiB): Bytes the peer may send on one channel before we return credit
            (formats with flow control).
        ack_min (20 KiB): Smallest batch of consumed bytes for which credit is returned (the
            threshold is max(ack_min, receive_window / 8)).
        max_channels (1,024): Open channels per session (both directions); offers beyond it are
            rejected.
        accept_backlog (256): Incoming channels accepted but not yet taken by accept_channel;
            offers beyond it are rejected.
        write_buffer_high (256 KiB): Per channel: unsent bytes above which drain() blocks.
        write_buffer_low (None): Per channel: unsent bytes at or below which drain() resumes
            (default high/4).
        stream_limit (64 KiB): limit of each channel's asyncio.StreamReader (line length for
            readline).
        batch_bytes (256 KiB): The send scheduler writes at most this much to the socket per
            turn.
        handshake_timeout (10 s): Seconds to wait for the peer's handshake (formats that have
            one).
        close_timeout (10 s): Seconds Session.aclose() gives queued data and the peer's goodbye
            before it cuts the connection; also how long a closed channel waits for the peer's
            end.
        max_receive_window (None): Kept for compatibility: sets YamuxOptions.max_receive_window,
            the largest window yamux's auto-tuning grows a stream's to (16 MiB; None: the
            option's value).
        window_budget (None): Kept for compatibility: sets YamuxOptions.window_budget, the
            window yamux grants beyond the initial 256 KiB per stream, summed over the session
            (256 MiB; None: the option's value).
        keepalive_interval (15 s): Seconds between keepalive pings (formats with pings:
            yamux, Streamux, and smux, whose NOP nothing answers: there any whole frame from
            the peer counts as its answer); on formats without pings (MultiplexingStream,
            mplex, omnistreams) and smux, polymux heartbeats (a frame every implementation
            ignores), at least every 15 s whatever this is; it also sets the TCP keepalive
            of the connections polymux makes and accepts (first probe after this long
            without a byte from the peer).
        keepalive_timeout (10 s): Seconds a ping may go unanswered before the session fails
            (a dead peer must not hang readers), and a peer that sends heartbeats or pings
            may stay silent past its interval (at least ours) before it is judged gone.
        stall_timeout (None): Seconds the peer may take none of the bytes we have written to the
            connection while a keepalive ping waits behind them; then the session ends ("the
            peer has taken none of our bytes ...").
        idle_timeout (300 s): Seconds a session with no channels may go without receiving a byte
            before it is closed: a half-open connection (the peer vanished without a FIN), or a
            peer that connects and never speaks (not even its handshake), must not hold a socket
            forever.
        stream_open_timeout (75 s): Seconds an opened stream may wait for the peer's
            acknowledgement before it is reset (yamux; hashicorp's default).
        max_unacked_opens (256): yamux: channels we opened that the peer has not acknowledged
            yet.
        streamux_id_bits (None): Kept for compatibility: sets StreamuxOptions.id_bits, the
            request-id bits a Streamux session offers ((1, 29, 14); None: the option's value).
        streamux_length_bits (None): Kept for compatibility: sets StreamuxOptions.length_bits,
            the chunk-length bits a Streamux session offers ((6, 30, 16); None: the option's
            value).
        streamux_quick_init (None): Kept for compatibility: sets StreamuxOptions.quick_init
            ("off", "request" or "allow"; None: the option's value, "off").
        streamux_response_hold (None): Kept for compatibility: sets
            StreamuxOptions.response_hold, the bytes one Streamux response may hold unsent while
            its request is still arriving (64 MiB; None: the option's value).
        streamux_hold_budget (None): Kept for compatibility: sets StreamuxOptions.hold_budget,
            what all the held responses of one Streamux session may hold together (64 MiB; None:
            the option's value).
        streamux_early_responses (None): Kept for compatibility: sets
            StreamuxOptions.early_responses, a polymux extension that lets one Streamux channel
            carry a conversation (False; None: the option's value).
        omnistreams_numbering (None): Kept for compatibility: "legacy" with
            protocol="omnistreams" is the format omnistreams-legacy (npm omnistreams 0.9.0's
            numbering), "spec" the format omnistreams; None: the format's own numbering.
        max_message_size (None): Largest frame body accepted (a larger one is a protocol error);
            writes are sent in frames of at most min(max_message_size, send_frame) bytes.
        send_frame (64 KiB): Largest frame polymux sends for formats without a fixed frame size:
            small enough that the round-robin scheduler interleaves channels finely.
        slow_reader ('block'): What to do when a channel has receive_window unread bytes and the
            format gives the peer no credit to withhold: "block" stops reading the connection
            until the reader catches up (nothing is lost, other channels wait too); "reset" does
            the same for at most slow_reader_timeout seconds, then resets that channel (its
            reader gets ChannelOverflow) and reads on.
        slow_reader_timeout (5 s): slow_reader="reset": seconds a full channel may hold up the
            connection before it is reset (go-mplex: 5 s); 0 resets it as soon as it is full
            (js-libp2p-mplex resets a stream past a 4 MiB buffer: set receive_window to 4 MiB
            for that behaviour).
        max_inbound_channels (1,024): Channels the peer may have open at once; its further opens
            are reset.
        max_outbound_channels (1,024): Channels we may have open at once; opening more raises
            LimitExceeded.
        inbound_channel_rate (10,000/s): New channels per second the peer may open (burst of as
            many), counted as the opens arrive, refused ones included; a peer above the rate is
            a protocol violation (js-libp2p-mplex disconnects such a peer).
        max_session_memory (33,554,432): The per-connection memory budget.
        smux_peer_buffer (None): Kept for compatibility: sets SmuxOptions.peer_buffer, the
            peer's session-wide receive buffer that smux version 2 keeps half of in flight (4
            MiB; None: the option's value).
        max_queued_control (4,096): Control frames (ping answers, acknowledgements, resets of
            refused channels) queued while the connection cannot be written: past it the session
            stops reading, so a peer that sends but does not read cannot make us queue replies
            without bound.
        send_timeout (30 s): Seconds the session may go on holding back reading because the peer
            does not read what we must send it (see max_queued_control and max_session_memory)
            with no progress on the socket; then the session ends (SessionClosed).
        max_name_bytes (4 KiB): Longest channel name (UTF-8 bytes) or creation metadata
            (omnistreams) accepted from the peer; offers with a longer one are refused.
        capture (None): Opt-in recording of the raw bytes each session sends and receives: a
            factory called once per session (see CaptureSink and tracing).
    """

    receive_window: int = 1024 * 1024
    """Bytes the peer may send on one channel before we return credit (formats with
    flow control). Bounds the memory one channel can use on the receiving side. The
    default is close to the current Nerdbank.Streams default (1,024,000): a window must
    cover bandwidth x round trip, and with ``ack_min`` batching a smaller one stalls bulk
    transfers on each acknowledgement."""

    ack_min: int = 20 * 1024
    """Smallest batch of consumed bytes for which credit is returned (the threshold is
    ``max(ack_min, receive_window / 8)``)."""

    max_channels: int = 1024
    """Open channels per session (both directions); offers beyond it are rejected."""

    accept_backlog: int = 256
    """Incoming channels accepted but not yet taken by ``accept_channel``; offers
    beyond it are rejected."""

    write_buffer_high: int = 256 * 1024
    """Per channel: unsent bytes above which ``drain()`` blocks."""

    write_buffer_low: int | None = None
    """Per channel: unsent bytes at or below which ``drain()`` resumes (default high/4)."""

    stream_limit: int = 64 * 1024
    """``limit`` of each channel's ``asyncio.StreamReader`` (line length for readline)."""

    batch_bytes: int = 256 * 1024
    """The send scheduler writes at most this much to the socket per turn."""

    handshake_timeout: float = 10.0
    """Seconds to wait for the peer's handshake (formats that have one). On a server's
    connection it is also the deadline of the peer's first whole frame on formats without a
    handshake (a channel the server opens first lifts it), of the TLS handshake and of the
    WebSocket upgrade: a connection that says nothing is closed then. Clients never have a
    first-frame deadline."""

    close_timeout: float = 10.0
    """Seconds ``Session.aclose()`` gives queued data and the peer's goodbye before it
    cuts the connection; also how long a closed channel waits for the peer's end."""

    # -- kept for compatibility: yamux's own options ----------------------------------------

    max_receive_window: int | None = None
    """Kept for compatibility: sets ``YamuxOptions.max_receive_window``, the largest window
    yamux's auto-tuning grows a stream's to (16 MiB; ``None``: the option's value)."""

    window_budget: int | None = None
    """Kept for compatibility: sets ``YamuxOptions.window_budget``, the window yamux grants
    beyond the initial 256 KiB per stream, summed over the session (256 MiB; ``None``: the
    option's value)."""

    keepalive_interval: float | None = 15.0
    """Seconds between keepalive pings (formats with pings: yamux, Streamux, and smux,
    whose NOP nothing answers: there any whole frame from the peer counts as its answer);
    on formats without pings (MultiplexingStream, mplex, omnistreams) and smux, polymux
    heartbeats (a frame every implementation ignores), at least every 15 s whatever this
    is; it also sets the TCP keepalive of the connections polymux makes and accepts (first
    probe after this long without a byte from the peer). None disables all three. With
    ``keepalive_timeout`` it bounds how long a vanished peer (a cut with no FIN or RST) goes
    unnoticed: interval + timeout, 25 s by default (``docs/connection-loss.md``: a peer is
    judged by its silence once it has shown that it sends heartbeats or pings; a foreign
    peer of a format without pings only by TCP keepalive)."""

    keepalive_timeout: float = 10.0
    """Seconds a ping may go unanswered before the session fails (a dead peer must not
    hang readers), and a peer that sends heartbeats or pings may stay silent past its
    interval (at least ours) before it is judged gone. Only an answer proves the peer alive: a peer that trickles bytes does
    not (on formats without credit, the peer's own pings count too: see ``stall_timeout``).
    The clock runs only while it can judge the peer: from when the ping has left our
    buffers (see ``stall_timeout`` for a peer that does not take it), and while we read the
    connection (our own limits, such as ``max_session_memory`` or a slow reader, pause it,
    and the clock starts again once we read). While the peer is busy delivering what it sent
    before the answer (full socket reads), the wait extends, never past 4 x
    ``keepalive_timeout``."""

    stall_timeout: float | None = None
    """Seconds the peer may take none of the bytes we have written to the connection while
    a keepalive ping waits behind them; then the session ends ("the peer has taken none of
    our bytes ..."). A peer that takes them slowly is never stalled. ``None``: the format's
    default, ``keepalive_timeout`` on formats with credit on the wire (mstream-v2/v3, yamux,
    omnistreams, smux version 2: a peer that grants credit reads what it granted) and 120 s
    on formats without (mstream-v1, mplex, multiplex, Streamux, smux version 1: there not
    reading is how a peer whose application is slow applies backpressure). On those formats
    a polymux session that does not read pings every ``min(keepalive_interval,
    keepalive_timeout / 2)`` meanwhile, and the peer's pings count as signs of life."""

    idle_timeout: float | None = 300.0
    """Seconds a session with no channels may go without receiving a byte before it is
    closed: a half-open connection (the peer vanished without a FIN), or a peer that
    connects and never speaks (not even its handshake), must not hold a socket forever.
    ``None`` disables it. Formats with pings also detect dead peers by keepalive."""

    stream_open_timeout: float = 75.0
    """Seconds an opened stream may wait for the peer's acknowledgement before it is
    reset (yamux; hashicorp's default). It also bounds how long ``open_channel`` waits for
    room under ``max_unacked_opens``."""

    max_unacked_opens: int = 256
    """yamux: channels we opened that the peer has not acknowledged yet. Beyond it,
    ``open_channel`` waits (in order) until the peer acknowledges one, as hashicorp/yamux's
    own ``OpenStream`` does. If an open is not acknowledged within ``stream_open_timeout``
    instead, it is reset and the first waiting ``open_channel`` raises
    :class:`~polymux.exceptions.LimitExceeded`. The default is hashicorp/yamux's accept
    backlog (256): a hashicorp peer resets every new stream that finds 256 streams waiting
    for its ``Accept()``, so opening more at once would lose some. Raise it only for peers
    with a larger backlog."""

    # -- kept for compatibility: Streamux's and omnistreams' own options ----------------------

    streamux_id_bits: tuple[int, int, int] | None = None
    """Kept for compatibility: sets ``StreamuxOptions.id_bits``, the request-id bits a
    Streamux session offers (``(1, 29, 14)``; ``None``: the option's value)."""

    streamux_length_bits: tuple[int, int, int] | None = None
    """Kept for compatibility: sets ``StreamuxOptions.length_bits``, the chunk-length bits a
    Streamux session offers (``(6, 30, 16)``; ``None``: the option's value)."""

    streamux_quick_init: str | None = None
    """Kept for compatibility: sets ``StreamuxOptions.quick_init`` (``"off"``,
    ``"request"`` or ``"allow"``; ``None``: the option's value, ``"off"``)."""

    streamux_response_hold: int | None = None
    """Kept for compatibility: sets ``StreamuxOptions.response_hold``, the bytes one
    Streamux response may hold unsent while its request is still arriving (64 MiB;
    ``None``: the option's value)."""

    streamux_hold_budget: int | None = None
    """Kept for compatibility: sets ``StreamuxOptions.hold_budget``, what all the held
    responses of one Streamux session may hold together (64 MiB; ``None``: the option's
    value)."""

    streamux_early_responses: bool | None = None
    """Kept for compatibility: sets ``StreamuxOptions.early_responses``, a polymux extension
    that lets one Streamux channel carry a conversation (``False``; ``None``: the option's
    value)."""

    omnistreams_numbering: str | None = None
    """Kept for compatibility: ``"legacy"`` with ``protocol="omnistreams"`` is the format
    ``omnistreams-legacy`` (npm ``omnistreams`` 0.9.0's numbering), ``"spec"`` the format
    ``omnistreams``; ``None``: the format's own numbering."""

    # -- formats without flow control on the wire (mplex / multiplex) ---------------------

    max_message_size: int | None = None
    """Largest frame body accepted (a larger one is a protocol error); writes are sent in
    frames of at most ``min(max_message_size, send_frame)`` bytes. ``None``: the format's
    default, 1 MiB for ``mplex`` (go-mplex, js-libp2p-mplex) and 16 MiB for ``multiplex``
    (the npm package has no limit and sends each write as one frame, so a bound is ours).
    omnistreams: the largest whole message (type, id, payload; default 1 MiB + 2), on
    byte streams checked from its 4-byte length prefix; it also caps our chunk size."""

    send_frame: int = 64 * 1024
    """Largest frame polymux sends for formats without a fixed frame size: small enough
    that the round-robin scheduler interleaves channels finely."""

    slow_reader: str = "block"
    """What to do when a channel has ``receive_window`` unread bytes and the format gives
    the peer no credit to withhold: ``"block"`` stops reading the connection until the
    reader catches up (nothing is lost, other channels wait too); ``"reset"`` does the
    same for at most ``slow_reader_timeout`` seconds, then resets that channel (its
    reader gets :class:`~polymux.exceptions.ChannelOverflow`) and reads on."""

    slow_reader_timeout: float = 5.0
    """``slow_reader="reset"``: seconds a full channel may hold up the connection before it
    is reset (go-mplex: 5 s); 0 resets it as soon as it is full (js-libp2p-mplex resets a
    stream past a 4 MiB buffer: set ``receive_window`` to 4 MiB for that behaviour)."""

    max_inbound_channels: int = 1024
    """Channels the peer may have open at once; its further opens are reset."""

    max_outbound_channels: int = 1024
    """Channels we may have open at once; opening more raises LimitExceeded."""

    inbound_channel_rate: float = 10_000.0
    """New channels per second the peer may open (burst of as many), counted as the opens
    arrive, refused ones included; a peer above the rate is a protocol violation
    (js-libp2p-mplex disconnects such a peer). High enough for request/response use
    (Streamux opens one channel per request), low enough that an open/reset flood (Rapid
    Reset) ends the session within one read of it."""

    max_session_memory: int = 32 * 1024 * 1024
    """The per-connection memory budget. Bytes received and not yet read by the
    application, plus bytes written and not yet sent while the socket takes none, summed
    over every channel: past the budget the session stops reading from the peer until they
    are down to three quarters of it. Bytes written and not yet sent: past half the budget
    every channel writer's ``drain()`` blocks until they are down to a quarter (bytes
    waiting for the peer's credit count here only, since reading is what brings the
    credit). So a session holds at most 1.5 times the budget in buffers (plus what an
    application that ignores ``drain()`` writes, and a Streamux server's held responses:
    ``streamux_hold_budget``). Receive windows of new channels are sized to fit the budget
    (MultiplexingStream v2/v3, omnistreams), and yamux windows grow only within it."""

    smux_peer_buffer: int | None = None
    """Kept for compatibility: sets ``SmuxOptions.peer_buffer``, the peer's session-wide
    receive buffer that smux version 2 keeps half of in flight (4 MiB; ``None``: the
    option's value)."""

    max_queued_control: int = 4096
    """Control frames (ping answers, acknowledgements, resets of refused channels) queued
    while the connection cannot be written: past it the session stops reading, so a peer
    that sends but does not read cannot make us queue replies without bound."""

    send_timeout: float | None = 30.0
    """Seconds the session may go on holding back reading because the peer does not read
    what we must send it (see ``max_queued_control`` and ``max_session_memory``) with no
    progress on the socket; then the session ends (``SessionClosed``). None: wait forever."""

    max_name_bytes: int = 4096
    """Longest channel name (UTF-8 bytes) or creation metadata (omnistreams) accepted from
    the peer; offers with a longer one are refused."""

    capture: CaptureFactory | None = None
    """Opt-in recording of the raw bytes each session sends and receives: a factory
    called once per session (see :class:`polymux.CaptureSink` and :mod:`polymux.tracing`).
    ``None`` (the default) costs one attribute test per read and per write batch."""

    def __post_init__(self) -> None:
        for name in (
            "receive_window",
            "ack_min",
            "max_channels",
            "write_buffer_high",
            "stream_limit",
            "batch_bytes",
            "max_session_memory",
            "max_queued_control",
            "max_name_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"SessionConfig.{name} must be a positive int, got {value!r}")
        if self.accept_backlog < 0:
            raise ValueError(f"SessionConfig.accept_backlog must be >= 0, got {self.accept_backlog!r}")
        low = self.write_buffer_low
        if low is not None and not 0 <= low <= self.write_buffer_high:
            raise ValueError(f"SessionConfig.write_buffer_low must be in 0..write_buffer_high, got {low!r}")
        if self.max_message_size is not None and (
            not isinstance(self.max_message_size, int) or self.max_message_size <= 0
        ):
            raise ValueError(
                f"SessionConfig.max_message_size must be a positive int, got {self.max_message_size!r}"
            )
        for name in ("send_frame", "max_inbound_channels", "max_outbound_channels", "max_unacked_opens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"SessionConfig.{name} must be a positive int, got {value!r}")
        if self.slow_reader not in ("block", "reset"):
            raise ValueError(
                f"SessionConfig.slow_reader must be 'block' or 'reset', got {self.slow_reader!r}"
            )
        if self.slow_reader_timeout < 0:
            raise ValueError(
                f"SessionConfig.slow_reader_timeout must be >= 0, got {self.slow_reader_timeout!r}"
            )
        if self.inbound_channel_rate <= 0:
            raise ValueError(
                f"SessionConfig.inbound_channel_rate must be positive, got {self.inbound_channel_rate!r}"
            )
        if self.keepalive_interval is not None and self.keepalive_interval <= 0:
            raise ValueError(
                f"SessionConfig.keepalive_interval must be positive or None, got {self.keepalive_interval!r}"
            )
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise ValueError(
                f"SessionConfig.idle_timeout must be positive or None, got {self.idle_timeout!r}"
            )
        if self.stall_timeout is not None and not self.stall_timeout > 0:
            raise ValueError(
                f"SessionConfig.stall_timeout must be positive or None, got {self.stall_timeout!r}"
            )
        if self.send_timeout is not None and not self.send_timeout > 0:
            raise ValueError(
                f"SessionConfig.send_timeout must be positive or None, got {self.send_timeout!r}"
            )
        for name in ("handshake_timeout", "close_timeout", "keepalive_timeout", "stream_open_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SessionConfig.{name} must be positive, got {getattr(self, name)!r}")

    @property
    def low_water(self) -> int:
        """The effective low-water mark of channel write buffers."""
        return self.write_buffer_high // 4 if self.write_buffer_low is None else self.write_buffer_low

    @classmethod
    def from_options(cls, config: SessionConfig | None = None, **options: Any) -> SessionConfig:
        """Return ``config`` (or the defaults) with ``options`` applied.

        Raises:
            TypeError: an unknown name, with the closest ones ("unknown session option
                'keepalive'; did you mean 'keepalive_interval' or 'keepalive_timeout'?").
            ValueError: a value the field does not take.
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(
                f"unknown session option {unknown[0]!r}{suggest(unknown[0], names)}"
                + (f" (and {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else "")
            )
        return replace(config or cls(), **options)


class SessionOptions(TypedDict, total=False):
    """The :class:`SessionConfig` fields as keyword options (``polymux.connect(...,
    receive_window=...)``): what ``**options`` of the API's entry points take, so that type
    checkers see a misspelt or mistyped option. Each is documented on the field."""

    receive_window: int
    ack_min: int
    max_channels: int
    accept_backlog: int
    write_buffer_high: int
    write_buffer_low: int | None
    stream_limit: int
    batch_bytes: int
    handshake_timeout: float
    close_timeout: float
    max_receive_window: int | None
    window_budget: int | None
    keepalive_interval: float | None
    keepalive_timeout: float
    stall_timeout: float | None
    idle_timeout: float | None
    stream_open_timeout: float
    max_unacked_opens: int
    streamux_id_bits: tuple[int, int, int] | None
    streamux_length_bits: tuple[int, int, int] | None
    streamux_quick_init: str | None
    streamux_response_hold: int | None
    streamux_hold_budget: int | None
    streamux_early_responses: bool | None
    omnistreams_numbering: str | None
    max_message_size: int | None
    send_frame: int
    slow_reader: str
    slow_reader_timeout: float
    max_inbound_channels: int
    max_outbound_channels: int
    inbound_channel_rate: float
    max_session_memory: int
    smux_peer_buffer: int | None
    max_queued_control: int
    send_timeout: float | None
    max_name_bytes: int
    capture: CaptureFactory | None
