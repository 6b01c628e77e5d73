"""Shared helpers of the tracing tests: record a real polymux session of any format over
loopback with :class:`CaptureRecorder`, and compare decoded records."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polymux
from polymux.tracing import Capture, CaptureRecorder, FrameRecord, read_session


SIZES = (1, 5_000, 70_001, 300_003)
"""Bytes the client sends on each channel (distinct, so channels can be told apart)."""


def reply_size(n: int) -> int:
    """Bytes the server answers to ``n`` bytes."""
    return n // 3 + 7


@dataclass
class Recorded:
    """A recorded session: the client's and the server's capture, and the directory."""

    client: Capture
    server: Capture
    directory: Path
    recorder_paths: list[Path]


def _pattern(n: int) -> bytes:
    return bytes(i * 7 % 251 for i in range(min(n, 4096))) * (n // 4096 + 1)


async def record_session(
    fmt: str,
    directory: Path,
    *,
    sizes: Iterable[int] = SIZES,
    frames: bool = False,
    recorder_options: dict[str, Any] | None = None,
    **options: Any,
) -> Recorded:
    """Run a real session of ``fmt`` on 127.0.0.1, both sides recorded: the client opens
    one channel per size, sends that many bytes and ends; the server reads all, answers
    :func:`reply_size` bytes and closes. Checks what arrived, then returns the captures.
    ``recorder_options`` go to :class:`CaptureRecorder`, ``options`` to the sessions."""
    sizes = list(sizes)
    recorder = CaptureRecorder(directory, frames=frames, **(recorder_options or {}))
    received: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        received.append(len(data))
        writer.write(_pattern(reply_size(len(data)))[: reply_size(len(data))])
        await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    async def one(session: polymux.Session, n: int) -> int:
        reader, writer = await session.open_pair(f"ch{n}")
        writer.write(_pattern(n)[:n])
        writer.write_eof()
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return len(answer)

    try:
        async with asyncio.timeout(30):
            server = await polymux.start_server(
                handler, "127.0.0.1", 0, protocol=fmt, capture=recorder, **options
            )
            try:
                port = server.sockets[0].getsockname()[1]
                session = await polymux.connect("127.0.0.1", port, protocol=fmt, capture=recorder, **options)
                answers = await asyncio.gather(*(one(session, n) for n in sizes))
                await session.aclose()
            finally:
                server.close()
                await server.wait_closed()
    finally:
        recorder.close()
    assert sorted(received) == sorted(sizes)
    assert sorted(answers) == sorted(reply_size(n) for n in sizes)
    by_role: dict[str, list[Path]] = {"client": [], "server": []}
    for path in recorder.paths:
        if path.name.endswith(".pmcap.parquet"):
            by_role["client" if "-client." in path.name else "server"].append(path)
    return Recorded(
        read_session(by_role["client"]), read_session(by_role["server"]), directory, recorder.paths
    )


def data_bytes(records: Iterable[FrameRecord]) -> dict[str, Counter[int]]:
    """Per direction, the multiset of per-channel data byte counts."""
    per: dict[tuple[str, str], int] = {}
    for r in records:
        if r.frame_type == "data":
            per[(r.direction, r.channel)] = per.get((r.direction, r.channel), 0) + r.length
    out: dict[str, Counter[int]] = {"c2s": Counter(), "s2c": Counter()}
    for (direction, _channel), n in per.items():
        out[direction][n] += 1
    return out


def stream(chunks: Iterable[tuple[int, str, bytes]], direction: str) -> bytes:
    """One direction's bytes."""
    return b"".join(data for _t, d, data in chunks if d == direction)


def without_time(records: Iterable[FrameRecord]) -> list[tuple[Any, ...]]:
    """Records with ``time_ns`` and ``session`` blanked (to compare decodes of the same
    bytes chunked differently)."""
    return [r._replace(time_ns=0, session="")[:] for r in records]
