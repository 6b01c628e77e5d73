"""Shared fixtures of the asyncio-layer tests: polymux servers that are torn down after
each test, and an echo channel handler."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import polymux


async def echo_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo a channel until the peer's end-of-writing, then close it."""
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(64 * 1024):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()


@pytest.fixture
def echo() -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """The echo channel handler."""
    return echo_handler


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[polymux.Server]]]:
    """``await serve(handler, protocol=..., **options)``: a polymux TCP server on
    127.0.0.1 (port 0), closed (its sessions aborted) after the test."""
    servers: list[polymux.Server] = []

    async def start(handler: Any = None, **kwargs: Any) -> polymux.Server:
        server = await polymux.start_server(handler, "127.0.0.1", 0, **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
    for server in servers:
        await asyncio.wait_for(server.wait_closed(), 5)
