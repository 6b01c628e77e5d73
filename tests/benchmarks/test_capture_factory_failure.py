"""Found while adding the suite's tracing row: a ``SessionConfig.capture`` factory that
raises in ``connection_made`` leaves the session neither ready nor failed, so
``polymux.connect`` hangs until ``handshake_timeout`` (10 s by default), even on formats
without a handshake, and the error only reaches the loop's exception handler."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import polymux


def _broken_capture(info: dict[str, Any]) -> Any:
    raise RuntimeError("capture factory failed")


@pytest.mark.xfail(
    strict=True,
    reason="aio/session.py MuxProtocol.connection_made: an exception from the capture factory "
    "is not turned into a failed session; connect() waits for handshake_timeout",
)
async def test_a_failing_capture_factory_fails_connect_promptly() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    async with await polymux.start_server(handler, "127.0.0.1", 0, protocol="mplex") as server:
        with pytest.raises(Exception, match="capture factory failed"):
            async with asyncio.timeout(3):
                await polymux.connect(
                    "127.0.0.1", server.port, protocol="mplex", capture=_broken_capture, handshake_timeout=8.0
                )
