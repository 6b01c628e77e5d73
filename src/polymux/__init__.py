"""polymux: many independent byte channels over one connection, in the multiplexing
wire formats real systems use, with stdlib ``StreamReader``/``StreamWriter`` per channel.

Quick start::

    session = await polymux.connect("127.0.0.1", 9000, protocol="mstream-v3")
    reader, writer = await session.open_channel("files/1")
"""

from __future__ import annotations

from polymux import _speedups


_speedups.install()  # before any module of the data plane: compiled, or its pure-Python twin

from polymux._types import CaptureFactory, CaptureSink
from polymux._version import __version__
from polymux.aio import (
    Channel,
    ChannelProtocols,
    ChannelTransport,
    Server,
    Session,
    connect,
    connect_unix,
    connect_websocket,
    over,
    reset,
    serve_websocket,
    start_server,
    start_unix_server,
)
from polymux.bridging import Bridge, Endpoint, bridge
from polymux.config import SessionConfig
from polymux.exceptions import (
    ChannelClosedError,
    ChannelError,
    ChannelOverflow,
    ChannelRejected,
    ChannelReset,
    FlowControlError,
    FormatMismatch,
    LimitExceeded,
    MissingExtra,
    PolymuxError,
    ProtocolError,
    SessionClosed,
)
from polymux.formats import PROTOCOLS


__all__ = [
    "PROTOCOLS",
    "Bridge",
    "CaptureFactory",
    "CaptureSink",
    "Channel",
    "ChannelClosedError",
    "ChannelError",
    "ChannelOverflow",
    "ChannelProtocols",
    "ChannelRejected",
    "ChannelReset",
    "ChannelTransport",
    "Endpoint",
    "FlowControlError",
    "FormatMismatch",
    "LimitExceeded",
    "MissingExtra",
    "PolymuxError",
    "ProtocolError",
    "Server",
    "Session",
    "SessionClosed",
    "SessionConfig",
    "__version__",
    "bridge",
    "connect",
    "connect_unix",
    "connect_websocket",
    "over",
    "reset",
    "serve_websocket",
    "start_server",
    "start_unix_server",
]
