"""What every engine shares (:mod:`polymux.engine` and :class:`polymux.engine.base.Engine`):
the registry entry points, the defaults a format without a feature keeps, and the queue of
frames to write."""

from __future__ import annotations

import re

import pytest

from polymux import PROTOCOLS
from polymux.engine.base import Engine
from polymux.engine.events import ChannelClosed, ChannelEnded, ChannelOpened
from polymux.exceptions import PolymuxError
from polymux.formats import get, make_engine
from polymux.wire.omnistreams import Kind, encode, encode_length


def test_the_registry_names_the_choices() -> None:
    for name in PROTOCOLS:
        assert get(name).name == name
    with pytest.raises(ValueError, match="nope") as info:
        get("nope")
    assert all(name in str(info.value) for name in PROTOCOLS)


@pytest.mark.parametrize("name", PROTOCOLS)
def test_features_a_format_lacks_are_refused_by_name(name: str) -> None:
    engine = make_engine(name)
    engine.data_to_send()  # (a handshake, an initialize message)
    fmt = re.escape(engine.format)
    if not engine.has_ping:
        with pytest.raises(NotImplementedError, match=f"^{fmt} has no ping$"):
            engine.ping()
    if not engine.has_controls:
        with pytest.raises(PolymuxError, match=f"{fmt} has no control messages"):
            engine.send_control(b"hello")
    assert engine.data_to_send() == []  # nothing half-sent


def test_formats_without_metadata_answer_none() -> None:
    engine = make_engine("yamux")
    handle = engine.open_channel("x")
    assert engine.metadata(handle) is None
    assert engine.metadata_object(handle) is None


def test_queued_frames_counts_the_chunks_to_write() -> None:
    engine = make_engine("yamux")
    assert engine.queued_frames == 0 and not engine.has_output
    engine.open_channel("a")
    engine.open_channel("b")
    assert engine.queued_frames == 2 and engine.has_output
    assert len(engine.data_to_send()) == 2
    assert engine.queued_frames == 0


def test_a_stream_forgotten_twice_is_released_once() -> None:
    # omnistreams keeps a stream that was created and ended in one read until the output
    # is next collected; closed by the application meanwhile, it is gone already then.
    engine = make_engine("omnistreams")
    create = encode(Kind.CREATE, 2, b'{"name":"e"}')
    end = encode(Kind.END, 2)
    events = engine.receive_data(encode_length(len(create)) + create + encode_length(len(end)) + end)
    handle = events[0].channel  # type: ignore[attr-defined]
    assert events == [ChannelOpened(handle, "e"), ChannelEnded(handle), ChannelClosed(handle)]
    engine.accept_channel(handle)
    engine.reset_channel(handle)
    assert not engine.is_live(handle) and engine.channel_count == 0
    engine.data_to_send()
    assert engine.channel_count == 0
    # The id is the peer's to create again.
    [opened] = engine.receive_data(encode_length(len(create)) + create)
    assert isinstance(opened, ChannelOpened) and engine.channel_count == 1


def _joined(engine: Engine) -> bytes:
    return b"".join(bytes(chunk) for chunk in engine.data_to_send())


@pytest.mark.parametrize("name", PROTOCOLS)
def test_whole_frames_end_where_the_frames_a_peer_sends_end(name: str) -> None:
    """``whole_frames`` reads the sizes of the frames a peer's engine sends from their
    headers (input slicing cuts a read there), changing nothing."""
    a, b = make_engine(name, is_client=True), make_engine(name, is_client=False)
    for _ in range(2):  # handshakes, initialize messages
        b.receive_data(_joined(a))
        a.receive_data(_joined(b))
    for label in ("x", "y", "z"):
        handle = a.open_channel(label)
        if a.send_credit(handle):
            a.send_data(handle, bytes(100))
    data = _joined(a)
    assert b.whole_frames(data, 0, 100) == len(data)
    first = b.whole_frames(data, 0, 1)
    assert 0 < first < len(data)
    b.receive_data(data[:first])  # exactly one frame: nothing is held
    assert b.whole_frames(data, first, 100) == len(data)
    assert Engine.whole_frames(b, data, 0, 4) == 0  # a format without a walk: cut by bytes


def test_whole_frames_cannot_tell_before_the_format_is_known() -> None:
    """Nothing to cut over a message transport (omnistreams over WebSocket), nor before
    Streamux's peer has sent its initialize message (its chunk widths)."""
    engine = make_engine("omnistreams", message_mode=True)
    assert engine.whole_frames(encode_length(3) + b"abc", 0, 4) == 0
    streamux = make_engine("streamux", is_client=False)
    assert streamux.whole_frames(bytes(64), 0, 4) == 0
