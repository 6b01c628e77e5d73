"""The polymux exception tree.

Every error polymux raises derives from :class:`PolymuxError`::

    PolymuxError
    ├── ProtocolError                  the peer broke the wire format; the session ends
    │   ├── FlowControlError           the peer sent more than the window it was given
    │   └── FormatMismatch             its very first bytes broke it: the peer probably
    │                                  speaks another protocol (``.first_bytes``)
    ├── ChannelError                   something ended one channel (other channels go on)
    │   ├── ChannelRejected            our offer was rejected (also ConnectionRefusedError)
    │   ├── ChannelReset               the peer reset/terminated the channel (also
    │   │                              ConnectionResetError); ``.message`` carries its text
    │   ├── ChannelOverflow            we reset it: its reader fell behind a peer that
    │   │                              cannot be slowed down (also ConnectionResetError)
    │   └── ChannelClosedError         the channel is closed for this operation (also
    │                                  BrokenPipeError)
    ├── SessionClosed                  the session is closed or its connection was lost
    │                                  (also ConnectionError)
    └── LimitExceeded                  a configured limit refused the request

    MissingExtra                       (a ModuleNotFoundError, not a PolymuxError) a
                                       module of an extra is not installed; the message
                                       says which: pip install 'polymux[EXTRA]'

Messages always name the wire format and, where there is one, the channel.
"""

from __future__ import annotations


__all__ = [
    "ChannelClosedError",
    "ChannelError",
    "ChannelOverflow",
    "ChannelRejected",
    "ChannelReset",
    "FlowControlError",
    "FormatMismatch",
    "LimitExceeded",
    "MissingExtra",
    "PolymuxError",
    "ProtocolError",
    "SessionClosed",
]


class PolymuxError(Exception):
    """Base class of every polymux exception."""


class ProtocolError(PolymuxError):
    """The peer (or the bytes being decoded) violated the wire format.

    Raised by codecs and engines; the asyncio layer ends the session with it,
    and every channel of that session then fails with :class:`SessionClosed`
    whose ``__cause__`` is this error.
    """

    diagnosis: str | None = None
    """When the violation came in the peer's very first bytes: what they suggest the peer
    speaks (another format, another version of this one), in words; else ``None``."""
    first_bytes: bytes = b""
    """The peer's first bytes (up to 64), when the violation came in them; else empty."""

    def __init__(self, fmt: str, message: str) -> None:
        super().__init__(f"{fmt}: {message}")
        self.format = fmt
        """The wire format's name, e.g. ``"mstream-v2"``."""
        self.detail = message
        """What was wrong, without the format prefix."""


class FlowControlError(ProtocolError):
    """The peer sent more bytes than the receive window it was given."""


class FormatMismatch(ProtocolError):
    """The peer's first bytes are not this wire format: it probably speaks another protocol
    (an HTTP or TLS server, SSH, another multiplexing format) rather than a broken version of
    this one. The message says what it sent and, where the bytes tell (HTTP, TLS, SSH), what
    the peer is; :func:`polymux.tracing.diagnose` can name other multiplexing formats from
    :attr:`first_bytes`. Raised (as the cause of :class:`SessionClosed`) when a violation
    comes within the first bytes the peer sent."""

    def __init__(self, fmt: str, detail: str, first_bytes: bytes, foreign: str | None = None) -> None:
        super().__init__(fmt, detail)
        self.diagnosis = detail
        self.first_bytes = first_bytes
        """The first bytes the peer sent (up to 64)."""
        self.foreign = foreign
        """The protocol the bytes show (``"HTTP"``, ``"TLS"``, ``"SSH"``), or None."""


class ChannelError(PolymuxError):
    """Base class of errors that end a single channel."""


class ChannelRejected(ChannelError, ConnectionRefusedError):
    """The peer rejected our channel offer."""

    def __init__(self, fmt: str, channel: str, name: str) -> None:
        super().__init__(f"{fmt}: the offer of {channel} was rejected by the peer")
        self.format = fmt
        self.channel = channel
        self.name = name


class ChannelReset(ChannelError, ConnectionResetError):
    """The peer terminated the channel before it ended cleanly.

    ``message`` is the error text the peer sent, when the format carries one
    (MultiplexingStream v2/v3, multiplex); otherwise ``None``.
    """

    def __init__(self, fmt: str, channel: str, message: str | None = None, *, by_peer: bool = True) -> None:
        text = f"{fmt}: {channel} was reset" + (" by the peer" if by_peer else "")
        if message:
            text += f": {message}"
        super().__init__(text)
        self.format = fmt
        self.channel = channel
        self.message = message


class ChannelOverflow(ChannelError, ConnectionResetError):
    """We reset the channel because its reader fell behind a peer that the wire format
    cannot slow down (the ``slow_reader="reset"`` policy), or because it held more unsent
    bytes than the format lets it wait with (a Streamux response held until its request
    ends: ``streamux_response_hold``, ``streamux_hold_budget``)."""


class ChannelClosedError(ChannelError, BrokenPipeError):
    """The operation is not possible because this side (or the peer) closed the channel."""


class SessionClosed(PolymuxError, ConnectionError):
    """The session was closed, or its connection was lost.

    When the session ended because of an error (a protocol violation, a reset
    connection), that error is the ``__cause__``.

    :attr:`ending` says how the connection ended (the peer closed it cleanly, reset it,
    vanished, broke the format, or we closed it); when the peer never spoke the format,
    :attr:`diagnosis` says why there was no session (what it sent, what it probably speaks:
    another format, another version of this one) and the message says it too. An error
    chained to the one the session ended with (``raise SessionClosed(...) from it``) says
    the same.
    """

    CLOSED = "closed"
    """:attr:`ending`: the peer closed the connection (a clean end of stream)."""
    RESET = "reset"
    """:attr:`ending`: the connection was reset or broke (``ECONNRESET``, ``EPIPE`` ...)."""
    VANISHED = "vanished"
    """:attr:`ending`: the peer went silent: a deadline for it passed (its handshake or
    first frame, a keepalive answer, taking our bytes)."""
    VIOLATION = "violation"
    """:attr:`ending`: the peer broke the wire format (the cause is the
    :class:`ProtocolError`)."""
    LOCAL = "local"
    """:attr:`ending`: we closed it (``aclose()``, ``abort()``, ``idle_timeout``)."""

    def __init__(
        self,
        *args: object,
        ending: str | None = None,
        first_bytes: bytes | None = None,
        diagnosis: str | None = None,
    ) -> None:
        super().__init__(*args)
        self._ending = ending
        self._first_bytes = first_bytes
        self._diagnosis = diagnosis

    def _chained(self) -> SessionClosed | None:
        """The first error of the cause chain that knows how the session ended."""
        error = self.__cause__
        for _ in range(8):
            if error is None:
                return None
            if isinstance(error, SessionClosed) and error._ending is not None:
                return error
            error = error.__cause__
        return None

    @property
    def ending(self) -> str | None:
        """How the connection ended: :attr:`CLOSED`, :attr:`RESET`, :attr:`VANISHED`,
        :attr:`VIOLATION` or :attr:`LOCAL`; ``None`` when the session did not end (an
        operation the session refused while it closes)."""
        if self._ending is not None:
            return self._ending
        chained = self._chained()
        if chained is not None:
            return chained._ending
        return self.VIOLATION if isinstance(self.__cause__, ProtocolError) else None

    @property
    def first_bytes(self) -> bytes:
        """The first bytes the peer sent (up to 64; empty: none)."""
        if self._first_bytes is not None:
            return self._first_bytes
        chained = self._chained()
        if chained is not None and chained._first_bytes is not None:
            return chained._first_bytes
        return self.__cause__.first_bytes if isinstance(self.__cause__, ProtocolError) else b""

    @property
    def diagnosis(self) -> str | None:
        """Why there was no session, when the peer never spoke the format: what it sent
        (or that it sent nothing, and whether it closed, reset or stayed silent), what it
        probably speaks, and what to try; ``None`` when the peer spoke the format."""
        if self._diagnosis is not None:
            return self._diagnosis
        chained = self._chained()
        if chained is not None:
            return chained._diagnosis
        return self.__cause__.diagnosis if isinstance(self.__cause__, ProtocolError) else None


class LimitExceeded(PolymuxError):
    """A configured limit (channels, pending offers, sizes) refused the request."""


class MissingExtra(ModuleNotFoundError):
    """A module of an optional extra is not installed (pyarrow for captures, dpkt for pcap
    files, websockets for WebSocket endpoints ...). The message names what needs it and the
    ``pip install 'polymux[EXTRA]'`` line; ``name`` is the module, :attr:`extra` the extra.
    Raised where the module is first needed (``CaptureRecorder(...)``, ``read_pcap``,
    ``connect_websocket`` ...); the ``polymux`` commands print the message as one line and
    exit 1."""

    def __init__(self, module: str, extra: str, needed_by: str) -> None:
        super().__init__(
            f"{needed_by} needs {module}, which is not installed: pip install 'polymux[{extra}]'", name=module
        )
        self.extra = extra
        """The extra that installs the module."""
