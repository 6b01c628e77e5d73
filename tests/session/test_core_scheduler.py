"""The session core's send scheduler, driven with bytes: control frames first, one frame per
channel in round-robin order, ``batch_bytes`` per batch, a channel alone filling its batch,
and how queued writes become frames."""

from __future__ import annotations

from polymux._types import BytesLike
from polymux.wire import yamux as ywire

from .corekit import open_to, pair, pump, received


def frames(out: list[BytesLike]) -> list[ywire.Frame]:
    return ywire.Decoder(1 << 30).feed(b"".join(bytes(p) for p in out))


def data_frames(out: list[BytesLike]) -> list[tuple[int, int]]:
    """(stream id, length) of each yamux Data frame."""
    return [(f.stream_id, f.length) for f in frames(out) if f.type == ywire.Type.DATA]


def test_control_frames_go_before_queued_channel_data() -> None:
    """A ping answer the peer asked for goes out ahead of a batch of channel data queued before
    the ping arrived (control first: the peer's keepalive is not stuck behind our bulk)."""
    a, b = pair("yamux", send_frame=1024)
    mine, _ = open_to(a, b)
    a.write(mine, b"d" * 8192)
    a.receive_data(ywire.encode_header(ywire.Type.PING, ywire.Flag.SYN, 0, 77), 1.0)
    out = frames(a.data_to_send())
    assert (out[0].type, out[0].flags, out[0].length) == (ywire.Type.PING, ywire.Flag.ACK, 77)
    assert [f.type for f in out[1:]] == [ywire.Type.DATA] * 8


def runs(frames: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Consecutive data frames of one stream joined: (stream id, bytes)."""
    out: list[tuple[int, int]] = []
    for sid, n in frames:
        if out and out[-1][0] == sid:
            out[-1] = (sid, out[-1][1] + n)
        else:
            out.append((sid, n))
    return out


def test_channels_take_turns_of_a_quantum_each() -> None:
    """Three channels go out interleaved, a turn of up to 64 KiB each (many small frames:
    consecutive frames of one channel merge on receive), in the order they became ready."""
    q = 64 * 1024
    a, b = pair("yamux", send_frame=1000, batch_bytes=1 << 20)
    handles = [open_to(a, b)[0] for _ in range(3)]
    ids = [int(a.engine.channel_name(h)) for h in handles]
    for h in handles:
        a.write(h, bytes(q + 5000))
    out = data_frames(a.data_to_send())
    assert max(n for _sid, n in out) == 1000
    assert runs(out) == [(i, q) for i in ids] + [(i, 5000) for i in ids]
    assert a.data_to_send() == [] and not a.has_output


def test_a_batch_stops_at_batch_bytes_and_the_next_goes_on_in_turn() -> None:
    """batch_bytes bounds one batch (it ends after the turn that reaches it); the next
    batch continues the round robin where it stopped, so no channel starts over at the
    head of the queue."""
    q = 64 * 1024
    a, b = pair("yamux", send_frame=16 * 1024, batch_bytes=q + q // 2)
    x, y, z = (open_to(a, b)[0] for _ in range(3))
    sx, sy, sz = (int(a.engine.channel_name(h)) for h in (x, y, z))
    for h in (x, y, z):
        a.write(h, bytes(2 * q))
    first = runs(data_frames(a.data_to_send()))
    assert first == [(sx, q), (sy, q)]  # 128 KiB >= 96 KiB: the batch ends
    second = runs(data_frames(a.data_to_send()))
    assert second == [(sz, q), (sx, q)]  # z's turn first, then the round goes on
    rest: list[tuple[int, int]] = []
    while a.has_output:
        rest += data_frames(a.data_to_send())
    assert sum(n for _sid, n in first + second + rest) == 6 * q


def test_a_channel_alone_fills_the_batch_in_one_turn() -> None:
    """With no other channel waiting, one turn takes up to batch_bytes (cut into frames of
    max_frame), not one frame per batch."""
    a, b = pair("yamux", send_frame=1024, batch_bytes=4096)
    x, _ = open_to(a, b)
    a.write(x, bytes(10_000))
    assert [n for _sid, n in data_frames(a.data_to_send())] == [1024] * 4
    assert a.has_output  # still ready: the rest waits for the next batch
    assert [n for _sid, n in data_frames(a.data_to_send())] == [1024] * 4
    assert [n for _sid, n in data_frames(a.data_to_send())] == [1024, 784]
    assert a.data_to_send() == []


def test_small_writes_are_joined_and_large_ones_go_as_views() -> None:
    """Runs of small writes become one part (one copy, frames stay full however the
    application cut its writes); a write of 64 KiB or more goes out as the caller's own
    bytes object (no copy)."""
    a, b = pair("yamux", send_frame=1 << 20, batch_bytes=1 << 20)
    x, y = open_to(a, b)
    for i in range(100):
        a.write(x, bytes([i]) * 10)
    out = a.data_to_send()
    assert len(out) == 2 and bytes(out[1]) == b"".join(bytes([i]) * 10 for i in range(100))
    big = bytes(100_000)
    a.write(x, big)
    out = a.data_to_send()
    assert len(out) == 2 and out[1] is big
    b.receive_data(b"".join(bytes(p) for p in out), 0.0)
    assert received(b.events(), y) == big


def test_take_splits_small_and_large_writes_at_the_quantum() -> None:
    """A turn smaller than what is queued cuts a write in two (a view; the rest stays
    queued, in order), whether it is a large write or inside a run of small ones; a small
    write just before a large one goes alone. Whatever the cuts, the peer reads the bytes
    in the order written."""
    a, b = pair("yamux", send_frame=1000, batch_bytes=1 << 20)
    x, y = open_to(a, b)
    z, _ = open_to(a, b)
    payload = [b"a" * 600, b"b" * 600, b"c" * 70_000, b"d" * 10, b"e" * 600]
    for p in payload:
        a.write(x, p)
    a.write(z, b"z" * 5000)  # another channel waiting: x gets one frame (1000 bytes) per turn
    first = a.data_to_send()
    # x's first turn: 600 "a" and the first 400 "b" joined in one part.
    assert bytes(first[1]) == b"a" * 600 + b"b" * 400
    b.receive_data(b"".join(bytes(p) for p in first), 0.0)
    pump(a, b)
    assert received(b.events(), y) == b"".join(payload)
