"""The near end survives its far end: connections in flight when the session breaks are
closed, new ones wait for the session (bounded), the near end reconnects with backoff and
asks for its -R listeners again; and both ends stop gracefully (open connections finish,
within a grace period)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import pytest

from polymux.forward import Backoff, start_far_end, start_near_end

from .helpers import exchange, pattern, target_server


pytestmark = pytest.mark.timeout(60)


async def _until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:  # noqa: ASYNC109
    """Wait until ``predicate()`` holds (polling the loop), or fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("protocol", ["yamux", "mstream-v3"])
async def test_the_near_end_reconnects_and_new_connections_wait_for_it(
    protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "polymux.forward")
    async with target_server() as port:
        far = await start_far_end(f"{protocol}:tcp:127.0.0.1:0", allow=["127.0.0.1:*"], reverse=True)
        far_port = far.endpoint.port
        near = await start_near_end(
            f"{protocol}:tcp:127.0.0.1:{far_port}",
            local=[f"0:127.0.0.1:{port}"],
            remote=[f"0:127.0.0.1:{port}"],
            backoff=Backoff(initial=0.05, maximum=0.2),
            session_wait=30.0,
        )
        try:
            local = near.forwards[0].bind.port
            assert await exchange(local, "echo", b"before") == b"before"
            reader, writer = await asyncio.open_connection("127.0.0.1", local)
            writer.write(b"hold\n")
            await _until(lambda: far.connections == 1)
            far.close()
            await far.wait_closed()
            # In flight when the session broke: closed.
            with contextlib.suppress(ConnectionResetError):
                assert await reader.read() == b""
            writer.close()
            await _until(lambda: not near.connected)
            # A new connection waits for the session; the far end comes back on its port.
            waiting = asyncio.ensure_future(exchange(local, "echo", b"waited"))
            far = await start_far_end(
                f"{protocol}:tcp:127.0.0.1:{far_port}", allow=["127.0.0.1:*"], reverse=True
            )
            assert await waiting == b"waited"
            assert near.sessions == 2 and near.connected
            # -R was asked for again (on a new port: it asked for port 0).
            payload = pattern(256 * 1024, seed=3)
            assert await exchange(near.forwards[1].bind.port, "echo", payload) == payload
            assert "reconnecting in" in caplog.text and "reconnected to the far end" in caplog.text
        finally:
            near.close()
            far.close()
            await near.wait_closed()
            await far.wait_closed()


async def test_without_a_session_new_connections_are_refused_after_session_wait() -> None:
    async with target_server() as port:
        far = await start_far_end("mplex:tcp:127.0.0.1:0", allow=["127.0.0.1:*"])
        near = await start_near_end(
            f"mplex:tcp:127.0.0.1:{far.endpoint.port}",
            local=[f"0:127.0.0.1:{port}"],
            backoff=Backoff(initial=0.05, maximum=0.1),
            session_wait=0.2,
        )
        try:
            far.close()
            await far.wait_closed()
            await _until(lambda: not near.connected)
            assert await exchange(near.forwards[0].bind.port, "echo", b"x") == b""
            assert near.stats.refused == 1
        finally:
            near.close()
            await near.wait_closed()


async def test_aclose_lets_open_connections_finish() -> None:
    async with target_server() as port:
        far = await start_far_end("smux-v2:tcp:127.0.0.1:0", allow=["127.0.0.1:*"])
        near = await start_near_end(
            f"smux-v2:tcp:127.0.0.1:{far.endpoint.port}", local=[f"0:127.0.0.1:{port}"]
        )
        local = near.forwards[0].bind.port
        reader, writer = await asyncio.open_connection("127.0.0.1", local)
        writer.write(b"echo\nfirst half ")
        await _until(lambda: far.connections == 1)
        closing = asyncio.ensure_future(asyncio.gather(near.aclose(), far.aclose()))
        await _until(lambda: near._closing and far._closing)
        # Stopped accepting...
        assert not any(server.is_serving() for server in near._servers)
        # ... while the open connection goes on to its end.
        writer.write(b"second half")
        writer.write_eof()
        assert await reader.read() == b"first half second half"
        writer.close()
        async with asyncio.timeout(20):
            await closing
        assert near.session is not None and near.session.is_closed
