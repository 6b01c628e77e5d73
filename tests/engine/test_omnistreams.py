"""omnistreams engine: bytes in, events and bytes out (no sockets)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from polymux.config import SessionConfig
from polymux.engine import events as ev
from polymux.engine.flow import MAX_MESSAGE_CREDIT, MessageCredit, MessageWindow, message_window, split_count
from polymux.engine.omnistreams import ControlReceived, OmnistreamsEngine
from polymux.exceptions import FlowControlError, ProtocolError
from polymux.formats import make_engine, resolve
from polymux.wire.omnistreams import LEGACY, SPEC, Kind, LengthPrefixDecoder, Numbering, encode, encode_length


def framed(kind: Kind, sid: int | None, payload: bytes = b"", numbering: Numbering = SPEC) -> bytes:
    message = encode(kind, sid, payload, numbering)
    return encode_length(len(message)) + message


def out_messages(engine: OmnistreamsEngine) -> list[bytes]:
    """What the engine queued, as whole messages (length prefixes checked and removed)."""
    data = b"".join(bytes(c) for c in engine.data_to_send())
    if engine.message_mode:
        raise AssertionError("use data_to_send() directly in message mode")
    decoder = LengthPrefixDecoder()
    messages = [bytes(m) for m in decoder.feed(data)]
    assert decoder.pending == 0
    return messages


def pump(a: OmnistreamsEngine, b: OmnistreamsEngine) -> list[ev.Event]:
    data = b"".join(bytes(c) for c in a.data_to_send())
    return b.receive_data(data) if data else []


def pair(**options: object) -> tuple[OmnistreamsEngine, OmnistreamsEngine]:
    config = SessionConfig.from_options(**options)  # type: ignore[arg-type]
    return OmnistreamsEngine(config), OmnistreamsEngine(config)


def open_accepted(a: OmnistreamsEngine, b: OmnistreamsEngine, name: str = "s") -> tuple[int, int]:
    handle = a.open_channel(name)
    events = pump(a, b)
    assert isinstance(events[0], ev.ChannelOpened)
    b.accept_channel(events[0].channel)
    assert pump(b, a) == [ev.CreditAvailable(handle)]
    return handle, events[0].channel


def test_make_engine_and_numbering_option() -> None:
    assert make_engine("omnistreams").format == "omnistreams"
    legacy = make_engine("omnistreams-legacy")
    assert isinstance(legacy, OmnistreamsEngine) and legacy.numbering is LEGACY
    by_config = make_engine("omnistreams", SessionConfig(omnistreams_numbering="legacy"))
    assert isinstance(by_config, OmnistreamsEngine) and by_config.numbering is LEGACY
    # The compatibility keyword is one more way to say "omnistreams-legacy": one format.
    assert resolve("omnistreams", SessionConfig(omnistreams_numbering="legacy")) is resolve(
        "omnistreams-legacy"
    )
    assert (
        resolve("omnistreams-legacy", SessionConfig(omnistreams_numbering="spec")).name
        == "omnistreams-legacy"
    )
    direct = OmnistreamsEngine(SessionConfig(omnistreams_numbering="legacy"))
    assert direct.numbering is LEGACY and direct.format == "omnistreams-legacy"
    with pytest.raises(ValueError, match="omnistreams_numbering must be 'spec' or 'legacy', got 'x'"):
        make_engine("omnistreams", SessionConfig(omnistreams_numbering="x"))
    with pytest.raises(ValueError, match="numbering must be 'spec' or 'legacy', got 'x'"):
        OmnistreamsEngine(SessionConfig(omnistreams_numbering="x"))


@pytest.mark.parametrize(
    ("numbering", "create", "req", "data", "end"),
    [("spec", 1, 5, 2, 3), ("legacy", 0, 4, 1, 2)],
)
def test_stream_bytes_both_numberings(numbering: str, create: int, req: int, data: int, end: int) -> None:
    a = OmnistreamsEngine(numbering=numbering)
    b = OmnistreamsEngine(numbering=numbering)
    handle = a.open_channel("files/1")
    meta = b'{"name":"files/1","chunkSize":65536}'
    wire = b"".join(bytes(c) for c in a.data_to_send())
    assert wire == encode_length(2 + len(meta)) + bytes((create, 0)) + meta
    [opened] = b.receive_data(wire)
    assert opened == ev.ChannelOpened(opened.channel, "files/1")
    assert b.metadata(opened.channel) == meta
    b.accept_channel(opened.channel)
    # receive_window 1 MiB / chunk 64 KiB = 16 messages, in one request.
    assert out_messages(b) == [bytes((req, 0, 16))]
    a.receive_data(framed(Kind.REQUEST_DATA, 0, b"\x10", a.numbering))
    assert a.send_credit(handle) == 16 * 65536
    a.send_data(handle, b"hello")
    assert out_messages(a) == [bytes((data, 0)) + b"hello"]
    assert a.end_channel(handle) is True
    assert out_messages(a) == [bytes((end, 0))]


def test_message_mode_one_element_per_message() -> None:
    a = OmnistreamsEngine(message_mode=True)
    b = OmnistreamsEngine(message_mode=True)
    handle = a.open_channel("x")
    [create] = a.data_to_send()
    assert bytes(create) == b'\x01\x00{"name":"x","chunkSize":65536}'
    [opened] = b.receive_data(bytes(create))
    b.accept_channel(opened.channel)
    [request] = b.data_to_send()
    assert bytes(request) == b"\x05\x00\x10"
    assert a.receive_data(bytes(request)) == [ev.CreditAvailable(handle)]
    a.send_data(handle, b"y" * (65536 + 10))
    messages = [bytes(m) for m in a.data_to_send()]
    assert [len(m) for m in messages] == [65538, 12]
    events = [e for m in messages for e in b.receive_data(m)]
    assert sum(e.flow_controlled_length for e in events if isinstance(e, ev.DataReceived)) == 65546


def test_writer_splits_into_chunks_and_credit_counts_messages() -> None:
    a, b = pair(send_frame=1000, receive_window=4000)  # 4 messages of credit
    handle, theirs = open_accepted(a, b)
    assert a.send_credit(handle) == 4000
    a.send_data(handle, b"x" * 2500)  # 3 messages: 1000, 1000, 500
    assert a.send_credit(handle) == 1000
    events = pump(a, b)
    assert [e.flow_controlled_length for e in events if isinstance(e, ev.DataReceived)] == [2500]
    a.send_data(handle, b"z")  # one message, though only 1 byte
    assert a.send_credit(handle) == 0
    with pytest.raises(ValueError, match="exceeds the available credit"):
        a.send_data(handle, b"more")
    pump(a, b)
    # Credit comes back per whole message consumed, batched by window // 4 = 1 message.
    b.ack_consumed(theirs, 999)
    assert out_messages(b) == []
    b.ack_consumed(theirs, 1)
    assert out_messages(b) == [b"\x05\x00\x01"]
    b.ack_consumed(theirs, 1000 + 500 + 1)  # the rest: three whole messages
    assert out_messages(b) == [b"\x05\x00\x03"]


def test_requests_above_255_are_split() -> None:
    a, b = pair(send_frame=16, receive_window=16 * 600)
    a.open_channel("big")
    [opened] = pump(a, b)
    b.accept_channel(opened.channel)
    assert out_messages(b) == [b"\x05\x00\xff", b"\x05\x00\xff", b"\x05\x00\x5a"]


def test_credit_exhaustion_then_request_resumes() -> None:
    a, b = pair(send_frame=100, receive_window=200)
    handle, theirs = open_accepted(a, b)
    a.send_data(handle, b"q" * 200)
    assert a.send_credit(handle) == 0
    pump(a, b)
    b.ack_consumed(theirs, 200)
    assert pump(b, a) == [ev.CreditAvailable(handle)]
    assert a.send_credit(handle) == 200


def test_id_reuse_across_1000_sequential_streams() -> None:
    a, b = pair(send_frame=64, receive_window=64 * 4)
    seen: set[int] = set()
    for i in range(1000):
        handle, theirs = open_accepted(a, b, f"s{i}")
        seen.add(a._record(handle).wire_id)
        payload = i.to_bytes(2, "big") * 10
        a.send_data(handle, payload)
        assert a.end_channel(handle) is True
        events = pump(a, b)
        assert events[0] == ev.DataReceived(theirs, events[0].data, 20)
        assert bytes(events[0].data) == payload
        assert events[1:] == [ev.ChannelEnded(theirs), ev.ChannelClosed(theirs)]
        assert a.channel_count == 0 and b.channel_count == 0
    assert seen == set(range(256))
    assert a.free_ids == 256


def test_257th_concurrent_stream_fails_clearly() -> None:
    a = OmnistreamsEngine()
    handles = [a.open_channel(str(i)) for i in range(256)]
    with pytest.raises(RuntimeError, match="all 256 stream ids are in use"):
        a.open_channel("one too many")
    a.end_channel(handles[17])
    a.open_channel("again")  # a freed id is reused
    assert a._record(a._next_handle - 1).wire_id == 17


def test_ids_are_per_direction() -> None:
    a, b = pair()
    mine, theirs_of_mine = open_accepted(a, b, "a->b")
    yours, theirs_of_yours = open_accepted(b, a, "b->a")
    assert a._record(mine).wire_id == 0 == b._record(yours).wire_id
    a.send_data(mine, b"from a")
    b.send_data(yours, b"from b")
    [got_b] = pump(a, b)
    [got_a] = pump(b, a)
    assert isinstance(got_b, ev.DataReceived) and got_b.channel == theirs_of_mine
    assert isinstance(got_a, ev.DataReceived) and got_a.channel == theirs_of_yours


def test_control_messages() -> None:
    a, b = pair()
    a.send_control(b"\x00ping")
    assert out_messages(a) == [b"\x00\x00ping"]
    a.send_control(b"")
    assert pump(a, b) == [ControlReceived(b"")]
    legacy = OmnistreamsEngine(numbering="legacy")
    assert legacy.receive_data(framed(Kind.CONTROL, None, b"hi", LEGACY)) == [ControlReceived(b"hi")]


def test_data_for_unknown_id_gets_cancel_send_once() -> None:
    b = OmnistreamsEngine()
    assert b.receive_data(framed(Kind.DATA, 9, b"?") + framed(Kind.DATA, 9, b"?")) == []
    assert out_messages(b) == [b"\x06\x09"]
    # The sender may then create the id afresh.
    [opened] = b.receive_data(framed(Kind.CREATE, 9, b""))
    assert isinstance(opened, ev.ChannelOpened) and opened.name == ""


def test_stale_data_after_our_cancel_is_ignored() -> None:
    a, b = pair()
    handle, theirs = open_accepted(a, b)
    a.send_data(handle, b"in flight")
    b.reset_channel(theirs)
    assert out_messages(b) == [b"\x06\x00"]
    assert pump(a, b) == []  # the data in flight: dropped, no second cancel
    assert b.data_to_send() == []
    a.end_channel(handle)  # the sender's END crossed our cancel
    assert pump(a, b) == []


def test_peer_cancels() -> None:
    a, b = pair()
    handle, theirs = open_accepted(a, b)
    b.end_channel(theirs)  # the reader closes early: CANCEL_SEND
    assert pump(b, a) == [ev.ChannelReset(handle, "cancelled by the receiver")]
    assert a.free_ids == 256
    handle, theirs = open_accepted(a, b)
    a.reset_channel(handle)  # spec numbering: CANCEL_RECEIVE
    assert pump(a, b) == [ev.ChannelReset(theirs, "cancelled by the sender")]


def test_legacy_sender_reset_is_an_end() -> None:
    a = OmnistreamsEngine(numbering="legacy")
    handle = a.open_channel()
    a.data_to_send()
    a.reset_channel(handle)
    assert out_messages(a) == [b"\x02\x00"]


@pytest.mark.parametrize("take", ["accept", "reject"])
def test_created_and_ended_in_one_read(take: str) -> None:
    b = OmnistreamsEngine()
    events = b.receive_data(framed(Kind.CREATE, 2, b'{"name":"empty"}') + framed(Kind.END, 2))
    handle = events[0].channel  # type: ignore[attr-defined]
    assert events == [ev.ChannelOpened(handle, "empty"), ev.ChannelEnded(handle), ev.ChannelClosed(handle)]
    assert b.is_live(handle)  # still there for the I/O layer to take
    if take == "accept":
        b.accept_channel(handle)
    else:
        b.reject_channel(handle)
    if take == "accept":
        assert b.metadata(handle) == b'{"name":"empty"}'  # readable while the I/O layer wires it
    assert b.data_to_send() == []  # no credit, no cancel for a stream that is over
    assert not b.is_live(handle) and b.channel_count == 0


def test_opaque_metadata_is_accepted() -> None:
    b = OmnistreamsEngine()
    [opened] = b.receive_data(framed(Kind.CREATE, 3, b"\xff\xfe not json"))
    assert isinstance(opened, ev.ChannelOpened) and opened.name == ""
    assert b.metadata(opened.channel) == b"\xff\xfe not json"
    assert b.metadata_object(opened.channel) is None


def test_extra_metadata_keys() -> None:
    a = OmnistreamsEngine()
    a.open_channel("n", extra={"pair": "t1"})
    raw = out_messages(a)[0][2:]
    assert json.loads(raw) == {"pair": "t1", "name": "n", "chunkSize": 65536}


# -- bad input ------------------------------------------------------------------------------


def accepted_receiver(**options: object) -> tuple[OmnistreamsEngine, int]:
    b = OmnistreamsEngine(SessionConfig.from_options(**options))  # type: ignore[arg-type]
    [opened] = b.receive_data(framed(Kind.CREATE, 1, b'{"name":"r","chunkSize":10}'))
    b.accept_channel(opened.channel)
    b.data_to_send()
    return b, opened.channel


def test_bad_unknown_type() -> None:
    b = OmnistreamsEngine()
    with pytest.raises(ProtocolError, match="omnistreams: unknown message type 9"):
        b.receive_data(encode_length(2) + b"\x09\x00")
    assert b.closed
    legacy = OmnistreamsEngine(numbering="legacy")
    with pytest.raises(ProtocolError, match="omnistreams-legacy: unknown message type 6"):
        legacy.receive_data(encode_length(2) + b"\x06\x00")


def test_bad_credit_overrun() -> None:
    b, _ = accepted_receiver(receive_window=30)  # 3 messages of 10 bytes
    b.receive_data(framed(Kind.DATA, 1, b"x") * 3)
    with pytest.raises(
        FlowControlError, match=r"STREAM_DATA beyond the credit on channel 1 .*\(3 messages requested\)"
    ):
        b.receive_data(framed(Kind.DATA, 1, b"x"))


def test_bad_data_before_any_credit() -> None:
    b = OmnistreamsEngine()
    with pytest.raises(FlowControlError, match="STREAM_DATA on channel 1 .* before any STREAM_REQUEST_DATA"):
        b.receive_data(framed(Kind.CREATE, 1, b"") + framed(Kind.DATA, 1, b"eager"))


def test_bad_chunk_larger_than_announced() -> None:
    b, _ = accepted_receiver()
    with pytest.raises(
        ProtocolError, match="STREAM_DATA of 11 bytes on channel 1 .* exceeds its chunkSize 10"
    ):
        b.receive_data(framed(Kind.DATA, 1, b"x" * 11))


def test_bad_data_after_end() -> None:
    b, _ = accepted_receiver()
    b.receive_data(framed(Kind.END, 1))
    with pytest.raises(ProtocolError, match="STREAM_DATA for stream 1 after its STREAM_END"):
        b.receive_data(framed(Kind.DATA, 1, b"late"))


def test_bad_end_twice_and_end_of_unknown() -> None:
    b, _ = accepted_receiver()
    b.receive_data(framed(Kind.END, 1))
    with pytest.raises(ProtocolError, match="STREAM_END for stream 1 after its STREAM_END"):
        b.receive_data(framed(Kind.END, 1))
    with pytest.raises(ProtocolError, match="STREAM_END for stream 5, which was never created"):
        OmnistreamsEngine().receive_data(framed(Kind.END, 5))


def test_bad_message_without_stream_id() -> None:
    b = OmnistreamsEngine()
    with pytest.raises(ProtocolError, match="STREAM_DATA message of 1 byte has no stream id byte"):
        b.receive_data(encode_length(1) + b"\x02")
    m = OmnistreamsEngine(message_mode=True)
    with pytest.raises(ProtocolError, match="CREATE_RECEIVE_STREAM message of 1 byte has no stream id"):
        m.receive_data(b"\x01")
    with pytest.raises(ProtocolError, match="empty message"):
        OmnistreamsEngine(message_mode=True).receive_data(b"")


def test_bad_create_twice_and_bad_chunk_size() -> None:
    b, _ = accepted_receiver()
    with pytest.raises(ProtocolError, match="CREATE_RECEIVE_STREAM for stream 1, which is already open"):
        b.receive_data(framed(Kind.CREATE, 1, b""))
    for bad in (b'{"chunkSize":0}', b'{"chunkSize":"9"}', b'{"chunkSize":true}', b'{"chunkSize":2000000}'):
        with pytest.raises(ProtocolError, match="chunkSize .* of stream 2 must be an int in 1..1048576"):
            OmnistreamsEngine().receive_data(framed(Kind.CREATE, 2, bad))


def test_bad_oversized_message_and_truncated_input() -> None:
    b = OmnistreamsEngine(SessionConfig(max_message_size=100))
    with pytest.raises(ProtocolError, match="length prefix 101 > max_message_size 100"):
        b.receive_data(encode_length(101))
    m = OmnistreamsEngine(SessionConfig(max_message_size=100), message_mode=True)
    with pytest.raises(ProtocolError, match="101-byte message exceeds max_message_size=100"):
        m.receive_data(b"\x02\x00" + b"x" * 99)
    c = OmnistreamsEngine()
    c.receive_data(framed(Kind.CONTROL, None, b"abc")[:-1])
    with pytest.raises(ProtocolError, match="connection ended inside a length-prefixed message"):
        c.receive_eof()


def test_requests_and_cancels_for_unknown_streams_are_ignored() -> None:
    a = OmnistreamsEngine()
    events = a.receive_data(
        framed(Kind.REQUEST_DATA, 4, b"\x05") + framed(Kind.CANCEL_SEND, 4) + framed(Kind.CANCEL_RECEIVE, 4)
    )
    assert events == [] and a.data_to_send() == []


# -- message credit arithmetic (engine/flow.py) -----------------------------------------------


@given(
    st.integers(1, 40),
    st.lists(st.integers(0, 100), min_size=1, max_size=60),
    st.lists(st.integers(1, 250), max_size=60),
)
def test_message_window_credits_only_consumed_messages(
    window: int, sizes: list[int], reads: list[int]
) -> None:
    recv = MessageWindow(window, max(1, window // 4))
    arrived: list[int] = []
    for size in sizes:
        if not recv.received_message(size):
            assert recv.outstanding == window  # refused only when the window is full
            break
        arrived.append(size)
    total = sum(arrived)
    consumed = 0
    granted = 0
    for n in reads:
        n = min(n, total - consumed)
        consumed += n
        granted += recv.consumed_bytes(n)
        # Never more than the messages whose bytes were all consumed (empty ones, which
        # hold no memory, count at once).
        whole = arrived.count(0)
        acc = 0
        for size in filter(None, arrived):
            acc += size
            if acc > consumed:
                break
            whole += 1
        assert granted <= whole
        assert recv.outstanding == len(arrived) - granted
    granted += recv.flush()
    assert granted <= len(arrived)


def test_message_credit_counts_partial_chunks() -> None:
    credit = MessageCredit(100)
    credit.grow(3)
    assert credit.available_bytes == 300
    assert credit.consume_bytes(150) == 2
    assert credit.available_bytes == 100
    assert credit.messages_for(0) == 1
    with pytest.raises(ValueError, match="exceeds the available credit of 1"):
        credit.consume_bytes(101)
    assert split_count(0) == [] and split_count(255) == [255] and split_count(600) == [255, 255, 90]


# -- edges of the interface ---------------------------------------------------------------------


def test_constructor_refuses_an_unknown_numbering_and_tiny_messages() -> None:
    with pytest.raises(ValueError, match="omnistreams numbering must be 'spec' or 'legacy', got 'x'"):
        OmnistreamsEngine(numbering="x")
    with pytest.raises(ValueError, match="omnistreams: max_message_size must be >= 3, got 2"):
        OmnistreamsEngine(SessionConfig(max_message_size=2))
    assert OmnistreamsEngine(SessionConfig(max_message_size=3)).chunk_size == 1
    assert OmnistreamsEngine().ready  # no handshake


def test_open_with_metadata_beyond_max_message_size_holds_nothing() -> None:
    # Regression: the refused open kept a live stream and its id, with no CREATE sent.
    a = OmnistreamsEngine(SessionConfig(max_message_size=100))
    with pytest.raises(ValueError, match="omnistreams: a 128-byte message exceeds max_message_size=100"):
        a.open_channel("x" * 100)
    assert a.channel_count == 0 and a.free_ids == 256 and a.data_to_send() == []
    handle = a.open_channel("ok")
    assert out_messages(a) == [b'\x01\x00{"name":"ok","chunkSize":98}']
    assert a.is_sender(handle)


def test_empty_stream_data_is_no_event_and_its_credit_returns_with_the_next_request() -> None:
    b, handle = accepted_receiver(receive_window=40)  # 4 messages of chunkSize 10, requested 1 by 1
    assert b.receive_data(framed(Kind.DATA, 1, b"")) == []
    [got] = b.receive_data(framed(Kind.DATA, 1, b"abc"))
    assert isinstance(got, ev.DataReceived) and bytes(got.data) == b"abc"
    b.ack_consumed(handle, 3)
    assert out_messages(b) == [b"\x05\x01\x02"]  # REQUEST_DATA 2: the empty one and "abc"


def test_end_of_a_stream_we_cancelled_then_its_id_created_again() -> None:
    b, handle = accepted_receiver()
    b.reset_channel(handle)
    assert out_messages(b) == [b"\x06\x01"]
    assert b.receive_data(framed(Kind.END, 1)) == []  # crossed our cancel
    with pytest.raises(ProtocolError, match="STREAM_END for stream 1 after its STREAM_END"):
        b.receive_data(framed(Kind.END, 1))


def test_create_with_metadata_beyond_max_name_bytes_is_refused() -> None:
    b = OmnistreamsEngine(SessionConfig(max_name_bytes=10))
    assert b.receive_data(framed(Kind.CREATE, 4, b'{"name":"far too long"}')) == []
    assert out_messages(b) == [b"\x06\x04"]  # CANCEL_SEND
    assert b.channel_count == 0


def test_rejecting_an_offer_cancels_it() -> None:
    b = OmnistreamsEngine()
    [opened] = b.receive_data(framed(Kind.CREATE, 7, b'{"name":"no"}'))
    assert isinstance(opened, ev.ChannelOpened)
    b.reject_channel(opened.channel)
    assert out_messages(b) == [b"\x06\x07"]
    assert b.receive_data(framed(Kind.DATA, 7, b"late")) == []  # in flight: dropped, no second cancel
    assert b.data_to_send() == []


def test_send_credit_is_zero_for_unknown_and_receive_only_streams() -> None:
    a, b = pair()
    handle, theirs = open_accepted(a, b)
    assert a.send_credit(handle) > 0
    assert b.send_credit(theirs) == 0  # one-way: the reader cannot write
    assert a.send_credit(999) == 0
    assert a.is_sender(handle) and not b.is_sender(theirs)


def test_send_data_in_several_parts_is_one_message() -> None:
    a, b = pair()
    handle, _ = open_accepted(a, b)
    a.send_data(handle, b"ab", memoryview(b"cd"), bytearray(b"e"))
    assert out_messages(a) == [b"\x02\x00abcde"]


def test_end_and_ack_of_unknown_or_own_streams_send_nothing() -> None:
    a, b = pair()
    handle, _ = open_accepted(a, b)
    assert a.end_channel(999) is True  # gone already: closed all the same
    a.ack_consumed(999, 10)
    a.ack_consumed(handle, 10)  # a stream we write has no receive credit
    assert a.data_to_send() == []


def test_control_message_must_fit_max_message_size() -> None:
    a = OmnistreamsEngine(SessionConfig(max_message_size=10))
    with pytest.raises(
        ValueError, match="omnistreams: a control message of 10 bytes exceeds max_message_size=10"
    ):
        a.send_control(b"x" * 10)
    a.send_control(b"x" * 9)
    assert out_messages(a) == [b"\x00" + b"x" * 9]


def test_a_tiny_chunk_size_cannot_make_one_create_cost_thousands_of_grants() -> None:
    """Credit amplification: a CREATE announcing chunkSize 1 (about 30 bytes) would be
    granted receive_window / 1 = 1,048,576 messages, 4,112 REQUEST_DATA messages. The grant
    is capped at MAX_MESSAGE_CREDIT messages: 5 REQUEST_DATA at most, fewer bytes out than
    the CREATE that asked for them."""
    engine = OmnistreamsEngine(SessionConfig())
    create = framed(Kind.CREATE, 0, json.dumps({"name": "x", "chunkSize": 1}).encode())
    (opened,) = engine.receive_data(create)
    assert isinstance(opened, ev.ChannelOpened)
    engine.accept_channel(opened.channel)
    grants = out_messages(engine)
    counts = [m[-1] for m in grants]
    assert sum(counts) == MAX_MESSAGE_CREDIT == 1024 and len(grants) == 5
    assert sum(len(m) + 4 for m in grants) < 2 * len(create)
    # The usual chunk sizes are not affected: 1 MiB / 64 KiB = 16 messages.
    assert message_window(1 << 20, 65536) == 16 and message_window(1 << 20, 1) == MAX_MESSAGE_CREDIT
    assert message_window(100, 1000) == 1
