"""The asyncio layer: sessions, channel transports, clients and servers."""

from __future__ import annotations

from polymux.aio.channel import ChannelTransport
from polymux.aio.client import connect, connect_unix, over
from polymux.aio.reader import ChannelStreamReader
from polymux.aio.server import Server, start_server, start_unix_server
from polymux.aio.session import ChannelProtocols, MuxProtocol, Session
from polymux.aio.streams import Channel, reset
from polymux.aio.websocket import connect_websocket, serve_websocket


__all__ = [
    "Channel",
    "ChannelProtocols",
    "ChannelStreamReader",
    "ChannelTransport",
    "MuxProtocol",
    "Server",
    "Session",
    "connect",
    "connect_unix",
    "connect_websocket",
    "over",
    "reset",
    "serve_websocket",
    "start_server",
    "start_unix_server",
]
