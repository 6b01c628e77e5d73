"""The session core's channels, driven with bytes and application calls: offers (the filter,
max_channels, max_inbound_channels with handlers still running, the accept backlog, the
open rate charged per open, names), opens and their limits, ends, lingering channels,
resets, Streamux's held responses, the peer's go-away, and the end of the connection."""

from __future__ import annotations

import pytest

from polymux.exceptions import (
    ChannelClosedError,
    ChannelOverflow,
    ChannelRejected,
    ChannelReset,
    LimitExceeded,
    ProtocolError,
    SessionClosed,
)
from polymux.session import SessionCore, events as ce
from polymux.wire import mplex as mwire, mstream as mswire, yamux as ywire

from .corekit import core, drain, of, one, open_to, pair, pump, received


def syn(stream: int) -> bytes:
    return ywire.encode_header(ywire.Type.WINDOW_UPDATE, ywire.Flag.SYN, stream, 0)


def rst(stream: int) -> bytes:
    return ywire.encode_header(ywire.Type.WINDOW_UPDATE, ywire.Flag.RST, stream, 0)


def yamux_frames(data: bytes) -> list[tuple[int, int, int]]:
    """(type, flags, stream id) of each yamux frame."""
    return [(f.type, f.flags, f.stream_id) for f in ywire.Decoder(1 << 20).feed(data)]


def new_stream(stream: int, name: str) -> bytes:
    body = name.encode()
    return mwire.encode_header(stream, mwire.Flag.NEW_STREAM, len(body)) + body


# -- offers ------------------------------------------------------------------------------------


def test_the_offer_filter_refuses_and_the_opener_learns_it() -> None:
    """MultiplexingStream: an offer the filter refuses is rejected on the wire; the opener's
    channel fails with ChannelRejected (OpenFailed, then Finished); an accepted one is
    Incoming on one side and Accepted on the other."""
    a, b = pair("mstream-v3", offer_filter=lambda name: name != "bad")
    bad = a.open_channel("bad")
    good = a.open_channel("good")
    pump(a, b)
    assert [(e.handle, e.name) for e in of(b.events(), ce.Incoming)] == [(2, "good")]
    events = a.events()
    failed = one(events, ce.OpenFailed)
    assert failed.handle == bad and isinstance(failed.error, ChannelRejected)
    assert of(events, ce.Finished) == [ce.Finished(bad)]
    assert of(events, ce.Accepted) == [ce.Accepted(good)]
    assert list(a.channels) == [good]


def test_offers_beyond_max_channels_are_refused() -> None:
    """max_channels counts both directions: with one of ours open, the peer's next offer is
    refused (yamux: reset) and the peer sees the reset."""
    a, b = pair("yamux", server={"max_channels": 2})
    b.open_channel()
    open_to(a, b)
    x = a.open_channel()
    pump(a, b)
    assert not of(b.events(), ce.Incoming)
    done = one(a.events(), ce.Finished)
    assert done.handle == x and isinstance(done.error, ChannelReset)


def test_max_inbound_channels_counts_handlers_still_running() -> None:
    """A reset channel whose handler still runs counts against max_inbound_channels (Rapid
    Reset: the peer cannot start unbounded work by opening and resetting); once the
    handler returns, the next open is accepted."""
    a, b = pair("yamux", server={"max_inbound_channels": 1})
    x, _ = open_to(a, b)
    b.handler_started()
    a.reset(x)
    pump(a, b)
    assert not b.channels
    a.open_channel()
    pump(a, b)
    assert not of(b.events(), ce.Incoming)
    b.handler_finished()
    open_to(a, b)


def test_the_accept_backlog_refuses_offers_until_the_application_takes_one() -> None:
    """Without a handler, incoming channels wait for accept_channel (accept_backlog of
    them); beyond it offers are refused, until taken() makes room."""
    a, b = pair("mplex", server={"accept_backlog": 1}, server_handler=False)
    _, first = open_to(a, b)
    a.open_channel()
    pump(a, b)
    assert not of(b.events(), ce.Incoming)
    b.taken(first)
    open_to(a, b)


def test_names_longer_than_max_name_bytes_are_refused() -> None:
    """max_name_bytes bounds an offer's name in UTF-8 bytes: too many characters are refused
    at a glance, and a short name of wide characters by its encoded size."""
    b = core("mplex", client=False, max_name_bytes=4)
    b.receive_data(new_stream(0, "abcde") + new_stream(1, "ééé") + new_stream(2, "abcd"), 0.0)
    assert [e.name for e in of(b.events(), ce.Incoming)] == ["abcd"]
    assert len(b.channels) == 1


def test_a_closing_session_refuses_offers() -> None:
    """After close(), the peer's new channels are refused (mplex has no go-away to say so)."""
    a, b = pair("mplex")
    b.close()
    a.open_channel()
    pump(a, b)
    assert not of(b.events(), ce.Incoming) and not b.channels


def test_the_open_rate_is_charged_per_open_as_read_reset_ones_included() -> None:
    """inbound_channel_rate is a token bucket charged for every open as it is read, one
    opened and reset within the same read too (Rapid Reset): a burst beyond it in one read
    ends the session with a protocol error. Tokens come back with time."""
    b = core("yamux", client=False, inbound_channel_rate=2.0)
    b.receive_data(syn(1) + rst(1) + syn(3) + rst(3), 0.0)
    assert not of(b.events(), ce.Incoming) and not b.failed
    b.receive_data(syn(5), 1.0)  # a second later: two tokens again
    assert one(b.events(), ce.Incoming)
    b.receive_data(syn(7) + syn(9), 1.0)
    failed = one(b.events(), ce.Failed)
    assert isinstance(failed.error, ProtocolError)
    assert "the peer opens channels faster than 2 per second" in str(failed.error)
    b.receive_data(syn(11), 2.0)  # failed: nothing more is read
    assert not b.events()


# -- our opens ------------------------------------------------------------------------------------


def test_open_limits_raise_limit_exceeded() -> None:
    """max_channels and max_outbound_channels bound our opens; an engine that cannot open
    (Streamux: every request id in flight) raises LimitExceeded too."""
    a, b = pair("mplex", client={"max_channels": 4, "max_outbound_channels": 2})
    open_to(b, a)
    a.open_channel()
    a.open_channel()
    with pytest.raises(LimitExceeded, match="max_outbound_channels=2"):
        a.open_channel()
    open_to(b, a)
    with pytest.raises(LimitExceeded, match="max_channels=4"):
        a.open_channel()

    s, _ = pair("streamux", streamux_id_bits=(1, 1, 1))
    s.open_channel()
    s.open_channel()
    with pytest.raises(LimitExceeded, match="all 2 request ids are in flight"):
        s.open_channel()


def test_no_opens_once_closing_failed_or_the_peer_goes_away() -> None:
    """check_open names why no channel may be opened: our close, the session's end, the
    peer's go-away."""
    a = core("yamux")
    a.close()
    with pytest.raises(SessionClosed, match="the session is closing"):
        a.open_channel()
    b = core("yamux")
    b.fail(ProtocolError("yamux", "boom"))
    with pytest.raises(SessionClosed, match="the session is closed"):
        b.check_open()
    with pytest.raises(SessionClosed, match="the session is closed"):
        b.send_control(b"x")


def test_the_peers_go_away_stops_our_opens_and_wakes_waiting_ones() -> None:
    """yamux GoAway(normal): no new channels (waiting opens are woken to fail), open ones
    go on."""
    a, b = pair("yamux")
    x, y = open_to(a, b)
    b.close()
    pump(a, b)
    assert of(a.events(), ce.RoomToOpen) == [ce.RoomToOpen(everyone=True)]
    assert a.peer_goaway == "the peer is going away (code 0: normal)"
    with pytest.raises(SessionClosed, match=r"no new channels: the peer is going away \(code 0: normal\)"):
        a.open_channel()
    a.write(x, b"still")
    pump(a, b)
    assert received(b.events(), y) == b"still" and not a.failed


def test_a_go_away_with_an_error_ends_the_session() -> None:
    """yamux GoAway(protocol error): the session fails, naming the peer's code."""
    a = core("yamux")
    a.receive_data(ywire.encode_header(ywire.Type.GO_AWAY, 0, 0, ywire.GoAwayCode.PROTOCOL_ERROR), 0.0)
    failed = one(a.events(), ce.Failed)
    assert "the peer went away with code 1: protocol error" in str(failed.error) and a.failed


# -- ends, lingering, resets ------------------------------------------------------------------


def test_both_ends_finish_the_channel_on_both_sides() -> None:
    """Each side ends its writing: the first end is Ended at the peer, the second finishes
    the channel on both sides (cleanly)."""
    a, b = pair("yamux")
    x, y = open_to(a, b)
    a.write(x, b"hi")
    a.write_eof(x)
    a.write_eof(x)  # twice: nothing more
    pump(a, b)
    events = b.events()
    assert received(events, y) == b"hi" and of(events, ce.Ended) == [ce.Ended(y)]
    b.write_eof(y)
    pump(a, b)
    assert of(b.events(), ce.Finished) == [ce.Finished(y)]
    assert of(a.events(), ce.Finished) == [ce.Finished(x)]
    a.write_eof(x)  # gone: nothing
    assert not a.channels and not b.channels and not a.unsent()


def test_a_channel_ended_before_acceptance_sends_its_data_and_end_once_accepted() -> None:
    """MultiplexingStream: what is written (and the end) before the peer accepts the offer
    waits, then goes out in order once it is accepted."""
    a, b = pair("mstream-v3")
    x = a.open_channel("early")
    a.write(x, b"before acceptance")
    a.write_eof(x)
    assert a.unsent()
    pump(a, b)
    events = b.events()
    (incoming,) = of(events, ce.Incoming)
    assert received(events, incoming.handle) == b"before acceptance"
    assert of(events, ce.Ended) == [ce.Ended(incoming.handle)]
    assert not a.unsent()


def test_an_accepted_offer_with_nothing_queued_waits_for_writes() -> None:
    """An accepted offer with nothing to send does not enter the scheduler."""
    a, b = pair("mstream-v3")
    x, _ = open_to(a, b)
    assert a.channels[x].accepted and not a.has_output


def test_closing_a_channel_lingers_until_the_peers_end_and_drops_what_arrives() -> None:
    """close_channel(): the application is done (Finished, lingering) once our end is out;
    the core keeps the channel until the peer ends, dropping (and crediting) what it
    still sends; then a plain Finished."""
    a, b = pair("yamux")
    x, y = open_to(a, b)
    a.write(x, b"last words")
    a.close_channel(x)
    pump(a, b)
    assert of(a.events(), ce.Finished) == [ce.Finished(x, lingering=True)]
    assert a.channels[x].lingering and not a.unsent()
    assert received(b.events(), y) == b"last words"
    b.write(y, bytes(200_000))
    pump(a, b)
    assert not of(a.events(), ce.Data) and a.budget.held == 0
    b.write(y, bytes(200_000))  # past the first window: the dropped bytes were credited
    b.write_eof(y)
    pump(a, b)
    assert of(a.events(), ce.Finished) == [ce.Finished(x)]
    assert of(b.events(), ce.Finished) == [ce.Finished(y)]
    assert not a.channels and not b.channels and b.budget.unsent == 0


def test_resets_either_way() -> None:
    """Our reset: the peer's channel fails with ChannelReset, ours finishes cleanly (queued
    data dropped). The peer's reset: ours fails with ChannelReset carrying its message
    where the format has one. Resetting a gone channel does nothing."""
    a, b = pair("mstream-v3")
    x, y = open_to(a, b)
    a.write(x, b"dropped")
    a.reset(x)
    a.reset(x)
    assert of(a.events(), ce.Finished) == [ce.Finished(x)] and a.budget.unsent == 0
    pump(a, b)
    done = one(b.events(), ce.Finished)
    assert done.handle == y and isinstance(done.error, ChannelReset)
    x, y = open_to(a, b)
    b.reset(y, "go away")
    pump(a, b)
    done = one(a.events(), ce.Finished)
    assert isinstance(done.error, ChannelReset) and "go away" in str(done.error)


def test_the_peer_closing_a_channel_we_still_write_fails_our_writes() -> None:
    """MultiplexingStream: the peer terminates a channel it has ended cleanly while we have
    not finished: the channel finishes without error for the reader, with a write error
    for the writer."""
    a, b = pair("mstream-v3")
    x, y = open_to(a, b)
    b.write_eof(y)
    pump(a, b)
    b.reset(y)  # no message, after its end: a clean close
    pump(a, b)
    done = of(a.events(), ce.Finished)[-1]
    assert done.handle == x and done.error is None
    assert isinstance(done.write_error, ChannelClosedError) and "closed by the peer" in str(done.write_error)


def test_the_peer_stopping_reading_stops_our_writing() -> None:
    """MultiplexingStream: the peer will read no more of a channel (ContentReadingCompleted):
    what we queued is dropped, writes fail (WritingStopped), our end goes out, reading goes
    on."""
    a, b = pair("mstream-v3")
    x, y = open_to(a, b)
    a.write(x, bytes(100))
    wire_id = a.engine._channels[x].wire_id  # type: ignore[attr-defined]
    # From the peer: the channel is ours (source "remote" in the sender's terms).
    a.receive_data(mswire.encode_header(3, mswire.ControlCode.CONTENT_READING_COMPLETED, wire_id, 0, -1), 0.0)
    stopped = one(a.events(), ce.WritingStopped)
    assert stopped.handle == x and "the peer stopped reading" in str(stopped.error)
    assert a.budget.unsent == 0 and a.channels[x].eof_requested
    b.write(y, b"still read")
    pump(a, b)
    events = a.events()
    assert received(events, x) == b"still read"
    assert a.channels[x].eof_sent and of(b.events(), ce.Ended) == [ce.Ended(y)]


# -- Streamux: held responses -------------------------------------------------------------------


def streamux_request(a: SessionCore, b: SessionCore, body: bytes) -> tuple[int, int]:
    """A request from ``a`` that has not ended, seen by ``b``: (a's handle, b's handle)."""
    x = a.open_channel()
    a.write(x, body)
    pump(a, b)
    return x, one(b.events(), ce.Incoming).handle


def test_a_streamux_response_is_held_until_its_request_ends() -> None:
    """Streamux: a response cannot go out before its request ended, and the requester cannot
    be slowed down; so the handler's writer is not paused past its high mark (the held
    bytes count against the format's own limits, not max_session_memory: only reading
    ends the request, so they must never pause it), and the response goes once the
    request ends."""
    a, b = pair("streamux", server={"write_buffer_high": 1000})
    x, y = streamux_request(a, b, b"question")
    assert b.write(y, bytes(5000)) is False
    assert b.channels[y].holding and b.budget.holding == 5000 and b.budget.held == len(b"question")
    assert b.write(y, bytes(5000)) is False
    pump(a, b)
    assert not received(a.events(), x)
    a.write_eof(x)
    pump(a, b)
    assert len(received(a.events(), x)) == 10_000
    assert not b.channels[y].holding and b.budget.holding == 0
    b.consumed(y, len(b"question"))
    assert b.budget.held == 0


def test_a_streamux_response_past_its_hold_limit_is_reset() -> None:
    """Past streamux_response_hold the held response is reset: the handler's channel
    finishes with ChannelOverflow naming the limit and how to raise it, and write() asks
    for no pause."""
    a, b = pair(
        "streamux",
        server={"write_buffer_high": 1000, "streamux_response_hold": 4000, "streamux_hold_budget": 8000},
    )
    _x, y = streamux_request(a, b, b"q")
    assert b.write(y, bytes(3000)) is False  # pauses? no: held (3000 <= 4000)
    assert b.write(y, bytes(3000)) is False  # 6000 > 4000: reset
    done = one(b.events(), ce.Finished)
    assert done.handle == y and isinstance(done.error, ChannelOverflow)
    assert "exceed streamux_response_hold=4000 (raise it" in str(done.error)
    assert y not in b.channels and b.budget.unsent == 0 and b.budget.holding == 0


def test_held_responses_past_max_session_memory_never_pause_reading() -> None:
    """Held responses beyond max_session_memory: reading goes on (it is what ends the
    requests they wait for), and the other writers are not held back by them."""
    a, b = pair("streamux", server={"write_buffer_high": 1000, "max_session_memory": 64 * 1024})
    _x1, y1 = streamux_request(a, b, b"1")
    _x2, y2 = streamux_request(a, b, b"2")
    assert b.write(y1, bytes(60_000)) is False
    assert b.write(y2, bytes(60_000)) is False
    assert b.reading and not of(b.events(), ce.Finished)
    assert b.budget.holding == 120_000 and b.budget.held == 2


def test_the_response_that_passes_the_hold_budget_is_reset_and_asks_for_no_pause() -> None:
    """The write that takes the session's held responses past streamux_hold_budget resets
    its own channel within write(), which asks for no pause (and does not queue it again);
    the other held response goes on."""
    a, b = pair(
        "streamux",
        server={"write_buffer_high": 1000, "streamux_response_hold": 50_000, "streamux_hold_budget": 60_000},
    )
    _x1, y1 = streamux_request(a, b, b"1")
    _x2, y2 = streamux_request(a, b, b"2")
    b.write(y1, bytes(20_000))
    b.write(y2, bytes(30_000))
    b.events()
    assert b.write(y2, bytes(20_000)) is False
    done = one(b.events(), ce.Finished)
    assert done.handle == y2 and "exceed streamux_hold_budget=60000 (raise it)" in str(done.error)
    assert not b.budget.held_writers and b.budget.unsent == 20_000 and b.budget.holding == 20_000
    b.data_to_send()  # its stale queue entry is skipped and dropped
    assert all(ch.handle != y2 for ch in b.scheduler.ready)
    assert y1 in b.channels and b.reading


# -- the end of the connection ------------------------------------------------------------------


def test_connection_lost_finishes_every_channel_keeping_what_ended_readable() -> None:
    """The connection is gone: channels the peer had ended finish with a write error only
    (what it sent stays readable); the others fail; waiting opens are woken; nothing more
    is sent or timed."""
    a, b = pair("yamux", keepalive_interval=15.0)
    x, y = open_to(a, b)
    v, _ = open_to(a, b)
    b.write_eof(y)
    pump(a, b)
    a.events()
    a.connection_lost(None)
    events = a.events()
    by_handle = {e.handle: e for e in of(events, ce.Finished)}
    assert by_handle[x].error is None and isinstance(by_handle[x].write_error, SessionClosed)
    assert isinstance(by_handle[v].error, SessionClosed)
    assert "the session's connection was closed" in str(by_handle[v].error)
    assert of(events, ce.RoomToOpen) == [ce.RoomToOpen(everyone=True)]
    assert a.next_deadline() is None and a.data_to_send() == []
    a.connection_lost(None)  # twice: nothing more
    assert not a.events()
    a.consumed(x, 10)  # the reader consumes what it kept: no credit on a closed engine
    a.reset(v)  # gone: nothing
    assert a.data_to_send() == []
    with pytest.raises(SessionClosed, match="the session is closed"):
        a.check_open()


def test_connection_lost_with_an_error_names_it() -> None:
    """Lost with an exception: the session failed, and the channels' error names it (its
    cause is the exception); after a session error, the channels name that error instead."""
    a, b = pair("mplex")
    open_to(a, b)
    a.connection_lost(ConnectionResetError("reset by peer"))
    done = one(a.events(), ce.Finished)
    assert "connection lost: reset by peer" in str(done.error) and a.failed
    assert isinstance(done.error.__cause__, ConnectionResetError)

    c = core("yamux")
    c.fail(ProtocolError("yamux", "bad frame"))
    c.fail(SessionClosed("later"))  # the first error stays the session's, one Failed event
    c.connection_lost(None)
    assert "bad frame" in str(c.error)
    assert [type(e) for e in c.events()] == [ce.Ready, ce.Failed, ce.RoomToOpen]


def test_a_protocol_error_ends_the_session_and_later_bytes_are_ignored() -> None:
    """Malformed input: the session fails with the engine's ProtocolError (a go-away goes
    out as the last words); bytes after it are not read."""
    a = core("yamux")
    drain(a)
    a.events()
    a.receive_data(ywire.encode_header(ywire.Type.DATA, 0, 0, 1) + b"x", 0.0)
    failed = one(a.events(), ce.Failed)
    assert isinstance(failed.error, ProtocolError)
    assert yamux_frames(drain(a)) == [(ywire.Type.GO_AWAY, 0, 0)]
    a.receive_data(syn(2), 1.0)
    assert not a.events()


def test_an_eof_inside_a_frame_is_a_protocol_error() -> None:
    """The peer's EOF cuts a frame in half: the session's error says so (an EOF after whole
    frames is a clean end)."""
    a = core("yamux")
    a.receive_data(syn(2)[:5], 0.0)
    a.receive_eof()
    assert isinstance(a.error, ProtocolError) and a.failed and a.closing
    c = core("yamux", idle_timeout=5.0)
    c.receive_data(syn(2)[:5], 1.0)  # half a frame, then nothing: idle
    c.handle_timer(6.0)
    c.receive_eof()  # the idle close stays the reason
    assert "idle_timeout" in str(c.error) and not c.failed
    d = core("yamux")
    d.receive_eof()
    assert d.error is None and d.closing


def test_a_reset_after_the_peers_eof_sends_nothing() -> None:
    """The peer ended the connection (EOF): resetting a channel before the loss is reported
    finishes it without a frame for an engine that is closed."""
    a, b = pair("yamux")
    x, _ = open_to(a, b)
    a.receive_eof()
    a.reset(x)
    assert of(a.events(), ce.Finished) == [ce.Finished(x)] and a.data_to_send() == []


def test_frames_after_an_overflow_reset_in_the_same_read_are_ignored() -> None:
    """slow_reader="reset" (no grace) resets a channel in the middle of a read; the frames
    for it later in the same read (its end, its close, the peer no longer reading) find no
    channel and are ignored."""
    a, b = pair("mplex", server={"receive_window": 4096, "slow_reader": "reset", "slow_reader_timeout": 0})
    x, y = open_to(a, b)
    b.write_eof(y)
    pump(a, b)
    b.events()
    a.write(x, bytes(5000))
    a.write_eof(x)
    b.receive_data(drain(a), 0.0)  # data, then the end: Ended and Closed for y
    assert [type(e) for e in b.events()] == [ce.Data, ce.Finished]
    assert not b.channels

    c, d = pair(
        "mstream-v1", server={"receive_window": 4096, "slow_reader": "reset", "slow_reader_timeout": 0}
    )
    x, y = open_to(c, d)
    c.write(x, bytes(5000))
    wire_id = c.engine._channels[x].wire_id  # type: ignore[attr-defined]
    stop = mswire.encode_header(1, mswire.ControlCode.CONTENT_READING_COMPLETED, wire_id, 0)
    d.receive_data(drain(c) + stop, 0.0)
    assert [type(e) for e in d.events()] == [ce.Data, ce.Finished]
