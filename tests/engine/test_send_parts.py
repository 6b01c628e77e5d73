"""``Engine.send_data(channel, data, *more)``: a run of bytes in several parts is framed as
one run (full frames across part boundaries, payloads as views), on every format that
frames through ``Engine._queue_frames``; and ``ChannelTransport._take`` hands the engine
such parts without copying large writes."""

from __future__ import annotations

from typing import Any

import pytest

from polymux.config import SessionConfig
from polymux.engine.base import Engine
from polymux.engine.events import ChannelOpened, DataReceived
from polymux.formats import make_engine
from polymux.session import SessionCore
from polymux.session.scheduler import COALESCE as _COALESCE


FORMATS = ["mstream-v1", "mstream-v2", "mstream-v3", "mplex", "multiplex", "yamux", "streamux"]


def pump(src: Engine, dst: Engine) -> list[Any]:
    out = b"".join(bytes(part) for part in src.data_to_send())
    return dst.receive_data(out) if out else []


def connected(fmt: str) -> tuple[Engine, Engine, int, int | None]:
    """Two engines with one channel open from the client; its handles on both sides
    (Streamux: the server sees the request with its first chunk, so None)."""
    config = SessionConfig(receive_window=16 * 1024 * 1024)
    client, server = make_engine(fmt, config, is_client=True), make_engine(fmt, config, is_client=False)
    pump(client, server)
    pump(server, client)
    handle = client.open_channel("parts")
    if fmt == "streamux":
        return client, server, handle, None
    events = pump(client, server)
    (opened,) = [e for e in events if isinstance(e, ChannelOpened)]
    server.accept_channel(opened.channel)
    pump(server, client)
    return client, server, handle, opened.channel


def received(events: list[Any], channel: int | None) -> bytes:
    return b"".join(
        bytes(part) for e in events if isinstance(e, DataReceived) and channel in (None, e.channel)
        for part in (e.data, *e.more)
    )  # fmt: skip


@pytest.mark.parametrize("fmt", FORMATS)
def test_parts_arrive_as_one_run(fmt: str) -> None:
    client, server, handle, theirs = connected(fmt)
    step = client.max_frame
    parts = [b"123456789", bytes(range(256)) * (step // 128), b"x" * 3, memoryview(b"y" * (step + 5))]
    assert client.send_credit(handle) >= sum(len(p) for p in parts)
    client.send_data(handle, *parts)
    assert received(pump(client, server), theirs) == b"".join(bytes(p) for p in parts)


@pytest.mark.parametrize(("fmt", "header"), [("yamux", 12), ("mstream-v1", 7)])
def test_frames_are_full_across_parts(fmt: str, header: int) -> None:
    """A 9-byte write then large ones: every frame but the last is full size."""
    client, server, handle, theirs = connected(fmt)
    step = client.max_frame
    parts = [b"h" * 9] + [bytes([i]) * 65536 for i in range(3)]  # within yamux's 256 KiB window
    total = sum(len(p) for p in parts)
    client.send_data(handle, *parts)
    out = client.data_to_send()
    frames = -(-total // step)
    assert sum(len(p) for p in out) == total + frames * header
    # The payload parts are the writes themselves or views of them: nothing was copied.
    assert all(type(p) is memoryview or len(p) in (header, 9, 65536) for p in out)
    assert received(server.receive_data(b"".join(bytes(p) for p in out)), theirs) == b"".join(parts)


def test_engine_frames_one_part_as_before() -> None:
    client, _server, handle, _theirs = connected("yamux")
    client.send_data(handle, b"z" * (2 * client.max_frame + 10))
    sizes = [len(p) for p in client.data_to_send()]
    assert sizes == [12, client.max_frame, 12, client.max_frame, 12, 10]


def test_take_returns_views_of_large_writes_and_joins_small_ones() -> None:
    core = SessionCore(make_engine("yamux"), SessionConfig(), 0.0)
    core.connection_made(0.0)
    handle = core.open_channel("t")
    channel = core.channels[handle]
    big = bytes(range(256)) * 1024  # 256 KiB
    core.write(handle, b"hdr")
    core.write(handle, b"len")
    core.write(handle, big)
    core.write(handle, big)
    parts = core.scheduler.take(channel, 100_000)
    assert [len(p) for p in parts] == [6, 100_000 - 6]
    assert parts[0] == b"hdrlen"
    assert isinstance(parts[1], memoryview) and parts[1].obj is big  # a view, not a copy
    parts = core.scheduler.take(channel, 400_000)
    assert [len(p) for p in parts] == [len(big) - (100_000 - 6), 400_000 - (len(big) - (100_000 - 6))]
    assert all(isinstance(p, memoryview) and p.obj is big for p in parts)
    # A long run of small writes is joined at most _COALESCE bytes at a time.
    for _ in range(3 * _COALESCE // 1000):
        core.write(handle, b"s" * 1000)
    rest = channel.buffered
    parts = core.scheduler.take(channel, rest)
    assert sum(len(p) for p in parts) == rest
    assert all(len(p) <= _COALESCE for p in parts[1:])
    assert channel.buffered == 0
