"""The session core's deadlines, driven with explicit times: keepalive (answered,
unanswered, a busy peer's extension capped at 4 x keepalive_timeout, smux's unanswered
ping), idle_timeout counting whole frames only, handshake_timeout, stream_open_timeout with
max_unacked_opens, a closed channel's close deadline, the timer heap's pruning, and a
server's first-frame deadline (handshake_timeout on formats without a handshake)."""

from __future__ import annotations

import pytest

from polymux.exceptions import ChannelReset, LimitExceeded, PolymuxError, SessionClosed
from polymux.session import NoRoomToOpen, SessionCore, events as ce
from polymux.wire import yamux as ywire

from .corekit import core, drain, of, one, open_to, pair, pump


KEEPALIVE = {"keepalive_interval": 15.0, "keepalive_timeout": 10.0}


def ping_syn(opaque: int) -> bytes:
    return ywire.encode_header(ywire.Type.PING, ywire.Flag.SYN, 0, opaque)


def keepalive_ping(c: SessionCore, now: float) -> int:
    """Run the timer at ``now`` and return the opaque of the keepalive ping it sent."""
    c.handle_timer(now)
    (frame,) = ywire.Decoder(1 << 20).feed(drain(c))
    assert (frame.type, frame.flags) == (ywire.Type.PING, ywire.Flag.SYN)
    return frame.length


# -- keepalive ----------------------------------------------------------------------------------


def test_keepalive_pings_every_interval_and_an_answer_keeps_the_session() -> None:
    """The first ping goes at once (its answer measures the RTT); the keepalive pings one
    interval later, and its answer (a PingAnswered with the round-trip time) schedules the
    next one an interval after it."""
    a, b = pair("yamux", **KEEPALIVE)
    assert a.next_deadline() == 15.0
    a.handle_timer(14.0)  # early: nothing
    assert not a.has_output
    a.handle_timer(15.0)
    assert a.next_deadline() == 25.0
    pump(a, b, 16.5)
    answered = one(a.events(), ce.PingAnswered)
    assert answered.rtt == 1.5
    assert a.next_deadline() == 31.5 and not a.failed


def test_an_unanswered_keepalive_ends_the_session() -> None:
    """No answer within keepalive_timeout: the session fails, saying so."""
    a = core("yamux", **KEEPALIVE)
    drain(a)
    keepalive_ping(a, 15.0)
    a.receive_data(ping_syn(5), 20.0)  # a trickle of frames is no answer
    a.handle_timer(25.0)
    failed = one(a.events(), ce.Failed)
    assert isinstance(failed.error, SessionClosed)
    assert "keepalive failed: no answer to a ping within 10 s (keepalive_timeout=10)" in str(failed.error)
    assert a.next_deadline() is None


def test_a_busy_peer_gets_more_time_but_never_past_four_timeouts() -> None:
    """While the peer fills our socket reads (its answer may sit behind what it sent), the
    keepalive waits another timeout, up to 4 x keepalive_timeout in all; then it fails."""
    a = core("yamux", **KEEPALIVE)
    drain(a)
    keepalive_ping(a, 15.0)
    flood = ping_syn(9) * 6000  # > 64 KiB in one read: a busy peer
    for t in (24.0, 34.0, 44.0):
        a.receive_data(flood, t)
        drain(a)
        a.handle_timer(t + 1.0)
        assert not a.failed and a.next_deadline() == t + 11.0
    a.receive_data(flood, 54.0)
    a.handle_timer(55.0)
    assert "within 40 s" in str(one(a.events(), ce.Failed).error)


def test_a_busy_peer_that_goes_quiet_fails_at_the_next_deadline() -> None:
    """One extension for a full read; no full read within the next timeout and no progress
    on our unsent bytes: the keepalive fails after two timeouts."""
    a = core("yamux", **KEEPALIVE)
    drain(a)
    keepalive_ping(a, 15.0)
    a.receive_data(ping_syn(9) * 6000, 20.0)
    a.handle_timer(25.0)
    assert not a.failed
    a.handle_timer(35.0)
    assert "within 20 s" in str(one(a.events(), ce.Failed).error)


def test_our_unsent_bytes_shrinking_extends_the_keepalive() -> None:
    """Our ping may sit behind what we send: while the socket's unsent bytes shrink (the
    peer reads), the keepalive waits longer; when they stop shrinking, it fails."""
    a = core("yamux", **KEEPALIVE)
    drain(a)
    a.handle_timer(15.0, 50_000)
    drain(a)
    a.handle_timer(25.0, 30_000)
    assert not a.failed and a.next_deadline() == 35.0
    a.handle_timer(35.0, 30_000)
    assert a.failed


def test_an_application_ping_answered_does_not_end_the_keepalive_wait() -> None:
    """The application's ping and its answer are its own: the keepalive still waits for the
    answer to its ping. A ping the application gave up on gets no event when answered."""
    a = core("yamux", **KEEPALIVE)
    drain(a)
    keepalive = keepalive_ping(a, 15.0)
    mine = a.ping(16.0)
    assert mine != keepalive
    drain(a)
    ack_mine = ywire.encode_header(ywire.Type.PING, ywire.Flag.ACK, 0, mine)
    a.receive_data(ack_mine, 17.0)
    assert one(a.events(), ce.PingAnswered).opaque == mine
    assert a.next_deadline() == 25.0
    other = a.ping(18.0)
    a.forget_ping(other)
    a.receive_data(ywire.encode_header(ywire.Type.PING, ywire.Flag.ACK, 0, other), 19.0)
    assert not of(a.events(), ce.PingAnswered)


def test_no_keepalive_ping_while_closing() -> None:
    """A session that is closing sends no keepalive ping (and fails no keepalive)."""
    a = core("yamux", **KEEPALIVE)
    drain(a)
    a.close()
    drain(a)
    a.handle_timer(15.0)
    assert not a.has_output and a.next_deadline() is None


def test_smux_keepalive_is_answered_by_any_frame_and_waits_one_interval_more() -> None:
    """smux: nothing answers a NOP, so the application cannot ping; the keepalive counts
    the peer's next whole frame as the answer, and waits keepalive_timeout plus one
    interval (an idle peer sends its own keepalive only once per interval). Besides, each
    side sends a heartbeat NOP every interval (test_core_silence.py)."""
    a, b = pair("smux", **KEEPALIVE)
    a.liveness.beats = False  # (the silence rule would end it first: test_core_silence.py)
    with pytest.raises(PolymuxError, match="smux has no ping"):
        a.ping(1.0)
    a.handle_timer(15.0)
    assert a.liveness.ka_deadline == 40.0 and a.next_deadline() == 30.0  # the next heartbeat
    b.receive_data(drain(a), 15.0)
    assert not b.has_output  # a NOP gets no answer
    b.handle_timer(15.0)
    a.receive_data(drain(b), 16.0)  # b's own keepalive NOP: a whole frame
    assert one(a.events(), ce.PingAnswered)
    assert a.liveness.ping_due == 31.0
    a.handle_timer(30.0)  # a heartbeat: no ping waits for what follows it
    a.handle_timer(31.0)
    drain(a)  # the NOP leaves: the wait starts
    for t in (45.0, 55.0):
        a.handle_timer(t)  # (its heartbeats meanwhile)
        drain(a)
    a.handle_timer(56.0)
    assert "within 25 s (keepalive_timeout=10)" in str(one(a.events(), ce.Failed).error)


def test_formats_without_ping_have_no_keepalive_ping() -> None:
    """mplex has no ping: ping() raises, and its keepalive is a heartbeat every interval
    (tests/session/test_core_silence.py)."""
    a = core("mplex", **KEEPALIVE)
    assert a.next_deadline() == 15.0
    with pytest.raises(PolymuxError, match="mplex has no ping"):
        a.ping(0.0)


# -- idle_timeout ---------------------------------------------------------------------------------


def test_idle_timeout_counts_whole_frames_only() -> None:
    """A session with no channels closes after idle_timeout without a whole frame from the
    peer: the bytes of a frame that never ends do not count; a whole frame restarts the
    clock. The close says goodbye on the wire (yamux GoAway)."""
    a = core("yamux", idle_timeout=300.0)
    drain(a)
    a.events()
    assert a.next_deadline() == 300.0
    a.receive_data(ping_syn(1), 100.0)
    drain(a)
    assert a.next_deadline() == 400.0
    a.receive_data(ping_syn(2)[:7], 350.0)  # half a frame: no activity
    assert a.next_deadline() == 400.0
    a.handle_timer(399.0)
    assert not a.events()
    a.handle_timer(400.0)
    failed = one(a.events(), ce.Failed)
    assert "closed after 300 s with no channels and no frame received (idle_timeout)" in str(failed.error)
    assert not a.failed and a.closing  # a clean end, not an error
    (goaway,) = ywire.Decoder(1 << 20).feed(drain(a))
    assert goaway.type == ywire.Type.GO_AWAY
    assert a.next_deadline() is None


def test_idle_timeout_waits_while_channels_are_open() -> None:
    """While a channel is open there is no idle deadline; when the last one goes the clock
    starts from then."""
    a, b = pair("mplex", idle_timeout=300.0)
    x, _ = open_to(a, b, now=10.0)
    assert a.next_deadline() is None
    a.handle_timer(500.0)
    a.reset(x)
    assert a.next_deadline() == 800.0


def test_idle_timeout_after_the_peers_eof_closes_no_engine_twice() -> None:
    """The peer ended the connection (EOF) and the driver has not reported the loss yet:
    the idle deadline still ends the session, without a goodbye on a closed engine."""
    a = core("yamux", idle_timeout=5.0)
    drain(a)
    a.receive_eof()
    a.handle_timer(5.0)
    assert one(a.events(), ce.Failed) and a.data_to_send() == []


# -- handshake_timeout ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["streamux", "mstream-v1"])
def test_no_handshake_within_handshake_timeout_ends_the_session(fmt: str) -> None:
    """A peer that connects and never completes its handshake is dropped at
    handshake_timeout (servers included)."""
    a = core(fmt, client=False, handshake_timeout=10.0)
    assert a.next_deadline() == 10.0
    a.handle_timer(9.0)
    assert not a.events()
    a.handle_timer(10.0)
    assert "no handshake from the peer within 10 s (handshake_timeout)" in str(
        one(a.events(), ce.Failed).error
    )
    a.handle_timer(20.0)  # failed: the timer does nothing more
    assert not a.events()


def test_a_handshake_in_time_clears_its_deadline() -> None:
    """The handshake completes: Ready, and no handshake deadline any more."""
    a, b = core("streamux", handshake_timeout=10.0), core("streamux", client=False, handshake_timeout=10.0)
    pump(a, b, 3.0)
    assert of(a.events(), ce.Ready) and a.next_deadline() is None


# -- a server's first frame (handshake_timeout, formats without a handshake) --------------------

NO_HANDSHAKE = ["mstream-v3", "mplex", "yamux", "omnistreams", "omnistreams-legacy", "smux", "smux-v2"]


@pytest.mark.parametrize("fmt", NO_HANDSHAKE)
def test_a_server_drops_a_peer_that_sends_nothing_within_handshake_timeout(fmt: str) -> None:
    """On a server's accepted connection (first_frame_deadline), a format without a handshake
    still has a deadline: the peer's first whole frame within handshake_timeout."""
    a = core(fmt, client=False, first_frame_deadline=True, handshake_timeout=10.0, now=100.0)
    drain(a)  # our own first ping (yamux, smux) is no word from the peer
    a.events()
    assert a.peer_silent and a.next_deadline() == 110.0
    a.handle_timer(109.0)
    assert not a.events()
    a.handle_timer(110.0)
    error = one(a.events(), ce.Failed).error
    assert isinstance(error, SessionClosed)
    assert "not one whole frame from the peer within 10 s (handshake_timeout)" in str(error)


@pytest.mark.parametrize("fmt", NO_HANDSHAKE)
def test_a_first_frame_in_time_lifts_the_deadline(fmt: str) -> None:
    """The client's first open (a whole frame) arrives a few seconds in: no deadline any
    more, and the peer is no longer silent (a full server would not shed it)."""
    a = core(fmt, client=True, handshake_timeout=10.0)
    b = core(fmt, client=False, first_frame_deadline=True, handshake_timeout=10.0)
    drain(b)
    assert a.next_deadline() is None  # clients have no first-frame deadline
    a.open_channel("x")
    pump(a, b, 9.0)
    assert of(b.events(), ce.Incoming)
    assert not b.peer_silent and b.next_deadline() is None
    b.handle_timer(10.0)
    assert not b.failed


def test_bytes_of_a_frame_that_never_ends_are_not_a_first_frame() -> None:
    """A peer that dribbles part of a frame has still sent no frame: the deadline holds."""
    a = core("mplex", client=True)
    b = core("mplex", client=False, first_frame_deadline=True, handshake_timeout=10.0)
    a.open_channel("x")
    frame = drain(a)
    b.receive_data(frame[:-1], 5.0)
    assert b.peer_silent and b.next_deadline() == 10.0
    b.handle_timer(10.0)
    assert one(b.events(), ce.Failed)


def test_a_channel_we_open_lifts_the_first_frame_deadline() -> None:
    """The server's application opens a channel to the peer (server push): the peer may only
    listen (an mplex reader sends nothing), so the deadline is lifted."""
    b = core("mplex", client=False, first_frame_deadline=True, handshake_timeout=10.0)
    b.open_channel("push")
    assert b.next_deadline() is None and b.peer_silent
    b.handle_timer(10.0)
    assert not b.failed


def test_a_handshake_format_keeps_its_handshake_deadline_and_hears_the_handshake() -> None:
    """Formats with a handshake: the deadline is the handshake's (its message says so), and
    the peer's handshake is its first frame."""
    b = core("streamux", client=False, first_frame_deadline=True, handshake_timeout=10.0)
    assert b.peer_silent and b.next_deadline() == 10.0
    b.handle_timer(10.0)
    assert "no handshake from the peer" in str(one(b.events(), ce.Failed).error)
    a = core("streamux", client=True, handshake_timeout=10.0)
    c = core("streamux", client=False, first_frame_deadline=True, handshake_timeout=10.0)
    pump(a, c, 1.0)
    assert not c.peer_silent and c.next_deadline() is None


# -- stream_open_timeout and max_unacked_opens ---------------------------------------------------


def test_opens_beyond_max_unacked_opens_wait_for_an_acknowledgement() -> None:
    """yamux: at most max_unacked_opens of our opens await the peer's ACK; one more raises
    NoRoomToOpen, and each ACK (or an unacknowledged channel ending) makes room
    (RoomToOpen)."""
    a, b = pair("yamux", client={"max_unacked_opens": 2})
    a.open_channel()
    y = a.open_channel()
    assert a.room_to_open == 0
    with pytest.raises(NoRoomToOpen, match="max_unacked_opens=2"):
        a.open_channel()
    a.reset(y)  # gone before its ACK: room for one
    assert one(a.events(), ce.RoomToOpen) == ce.RoomToOpen()
    assert a.room_to_open == 1
    pump(a, b)
    assert [type(e) for e in a.events()] == [ce.RoomToOpen, ce.Accepted]
    assert a.room_to_open == 2


def test_an_open_not_acknowledged_in_time_is_reset_and_fails_the_first_waiter() -> None:
    """An open the peer never acknowledges is reset at stream_open_timeout; the channel
    fails with ChannelReset, and RoomToOpen carries a LimitExceeded for the first waiting
    open (a peer that does not accept would reset it too). An open acknowledged in time
    is left alone by its timer."""
    a, b = pair("yamux", client={"max_unacked_opens": 2, "stream_open_timeout": 75.0})
    x = a.open_channel()
    pump(a, b, 1.0)  # acknowledged
    a.events()
    y = a.open_channel()  # never acknowledged: the peer does not see it
    stream = int(a.engine.channel_name(y))
    drain(a)
    assert a.next_deadline() == 75.0  # x's deadline: due, but x was acknowledged
    a.handle_timer(75.0)
    assert not a.events() and x in a.channels
    assert a.next_deadline() == 76.0
    a.handle_timer(76.0)
    events = a.events()
    done = one(events, ce.Finished)
    assert done.handle == y and isinstance(done.error, ChannelReset)
    assert "not acknowledged within stream_open_timeout=75 s" in str(done.error)
    room = one(events, ce.RoomToOpen)
    assert isinstance(room.error, LimitExceeded) and "stream_open_timeout=75 s" in str(room.error)
    assert x in a.channels
    frames = ywire.Decoder(1 << 20).feed(drain(a))
    assert [(f.stream_id, f.flags) for f in frames] == [(stream, ywire.Flag.RST)]


def test_opens_are_not_limited_on_formats_without_acknowledgements() -> None:
    """mplex: opens are usable at once and never acknowledged: no open deadline, no limit."""
    a = core("mplex", max_unacked_opens=1)
    for _ in range(3):
        a.open_channel()
    assert a.next_deadline() is None and a.room_to_open == 1


# -- a closed channel's deadline ------------------------------------------------------------


def test_a_closed_channel_whose_peer_never_ends_is_reset_at_close_timeout() -> None:
    """close_channel(): our end goes out, the channel lingers (Finished, lingering) until
    the peer ends its side; at close_timeout it is reset."""
    a, b = pair("yamux", close_timeout=10.0)
    x, _ = open_to(a, b)
    a.close_channel(x)
    a.close_channel(x)  # twice: nothing more
    pump(a, b)
    events = a.events()
    assert of(events, ce.Finished) == [ce.Finished(x, lingering=True)]
    assert a.next_deadline() == 10.0
    a.handle_timer(10.0)
    assert of(a.events(), ce.Finished) == [ce.Finished(x)]
    (rst,) = ywire.Decoder(1 << 20).feed(drain(a))
    assert rst.flags == ywire.Flag.RST


def test_a_closed_channel_that_the_peer_ends_in_time_finishes_cleanly() -> None:
    """The peer ends its side before close_timeout: the channel finishes; what it sent
    meanwhile was dropped and its credit returned; the deadline then finds nothing."""
    a, b = pair("yamux", close_timeout=10.0)
    x, y = open_to(a, b)
    b.write(y, bytes(1000))
    pump(a, b)
    a.events()
    assert a.channels[x].unconsumed == 1000
    a.close_channel(x)  # unread bytes released and credited
    assert a.channels[x].unconsumed == 0 and a.budget.held == 0
    b.write(y, bytes(500))  # arrives after close: dropped
    b.write_eof(y)
    pump(a, b)
    events = a.events()
    assert not of(events, ce.Data) and not of(events, ce.Ended)
    assert of(events, ce.Finished)[-1] == ce.Finished(x)
    a.handle_timer(10.0)
    assert not a.events()


@pytest.mark.parametrize("fmt", ["yamux", "streamux", "mplex"])
def test_a_closed_channel_still_sending_to_a_peer_that_reads_is_not_reset(fmt: str) -> None:
    """close() with more queued than the peer takes in close_timeout: while the peer takes
    some of it in each close_timeout, the deadline moves on and every byte arrives, then
    the end (a reset would have dropped the rest: Streamux shows it as a clean end)."""
    a, b = pair(fmt, close_timeout=10.0)
    if fmt == "streamux":
        # a serves b's request, and its response is what a closes with data queued.
        y = b.open_channel("")
        b.write(y, b"request")
        b.write_eof(y)
        pump(b, a)
        x = one(a.events(), ce.Incoming).handle
        b.events()
    else:
        x, y = open_to(a, b)
    a.write(x, bytes(4 * 1024 * 1024))
    a.close_channel(x)
    got = 0
    now = 0.0
    while x in a.channels:
        # The peer takes one batch per 9 s: slower than close_timeout for all of it.
        for chunk in a.data_to_send():
            b.receive_data(bytes(chunk), now)
        for event in b.events():
            if isinstance(event, ce.Data):
                got += event.n
                b.consumed(y, event.n, now)
        for chunk in b.data_to_send():
            a.receive_data(bytes(chunk), now)
        a.events()
        now += 9.0
        a.handle_timer(now)
        assert now < 10_000, "never finished"
    assert got == 4 * 1024 * 1024
    assert of(b.events(), ce.Ended) or b.channels.get(y) is None or b.channels[y].receiving.ended


def test_a_closed_channel_whose_end_waits_for_our_own_socket_is_not_reset() -> None:
    """close() while our socket takes nothing (or our writer is slow): the end has not gone
    out through no fault of the peer, which ended its side already: no reset at
    close_timeout; the end goes once the socket takes it, and the channel finishes."""
    a, b = pair("mplex", close_timeout=10.0)
    x, y = open_to(a, b)
    b.write_eof(y)
    pump(a, b)
    a.events()
    a.write(x, b"last words")
    a.socket_paused(True, 1 << 20)  # our socket is full: nothing leaves
    a.close_channel(x)
    a.handle_timer(10.0)
    a.handle_timer(20.0)
    assert x in a.channels and not of(a.events(), ce.Finished)
    a.socket_paused(False, 0)
    pump(a, b, 20.0)
    assert x not in a.channels
    assert of(a.events(), ce.Finished)[-1] == ce.Finished(x)
    assert b"last words" in b"".join(bytes(e.data) for e in of(b.events(), ce.Data))


def test_a_closed_channel_whose_peer_takes_nothing_is_reset_at_close_timeout() -> None:
    """close() with data queued and a peer that grants no credit: no progress within
    close_timeout, the channel is reset (its queued data dropped)."""
    a, b = pair("yamux", close_timeout=10.0)
    x, _ = open_to(a, b)
    a.write(x, bytes(1024 * 1024))  # beyond yamux's 256 KiB window: the rest waits for credit
    pump(a, b)  # (b does not read: no credit comes back)
    a.close_channel(x)
    assert a.channels[x].buffered
    a.handle_timer(10.0)
    assert x not in a.channels
    assert of(a.events(), ce.Finished)[-1] == ce.Finished(x)


# -- the timer heap -------------------------------------------------------------------------


def test_the_timer_heap_drops_entries_of_gone_channels() -> None:
    """Channel churn leaves deadlines of channels that are gone in the heap; once they are
    most of it they are dropped, so a long session's heap stays bounded by its live
    channels."""
    a = core("yamux")
    for _ in range(500):
        x = a.open_channel()
        a.reset(x)
    assert len(a.table.timers) <= 2 * len(a.channels) + 65
    live = a.open_channel()
    assert any(t[2] == live for t in a.table.timers)
    a.handle_timer(75.0)  # the dead entries due are skipped, the live one fires
    assert live not in a.channels


# -- liveness judges the peer, never ourselves ------------------------------------------------

STREAMUX_KA = {**KEEPALIVE, "receive_window": 1000}


def streamux_pair(**options: object) -> tuple[SessionCore, SessionCore, int, int]:
    """A Streamux client and server with a request open from the client: (a, b, a's
    handle, b's handle); the connection made at 0."""
    a, b = pair("streamux", **{**STREAMUX_KA, **options})  # type: ignore[arg-type]
    x = a.open_channel()
    a.write(x, b"q")
    pump(a, b)
    y = one(b.events(), ce.Incoming).handle
    return a, b, x, y


def stop_reading(a: SessionCore, b: SessionCore, x: int, now: float) -> None:
    """``a`` sends past ``b``'s receive_window on a request ``b``'s application does not
    read: ``b`` stops reading the connection (its slow-reader policy)."""
    a.write(x, bytes(5000))
    b.receive_data(drain(a), now)
    assert not b.reading


def test_no_keepalive_verdict_while_we_do_not_read_and_a_new_count_once_we_do() -> None:
    """Our own limits stop reading (a slow application on a format without credit): the
    peer's answer may sit unread in our socket, so the keepalive gives no verdict however
    long that lasts; once we read again, the peer gets a full keepalive_timeout."""
    a, b, _x, y = streamux_pair()
    stop_reading(a, b, _x, 1.0)
    b.handle_timer(15.0)
    drain(b)
    for t in (25.0, 60.0, 100.0):
        b.handle_timer(t)
        assert not b.failed
    b.consumed(y, 5001)  # the application reads: so does the session
    assert b.reading
    b.handle_timer(b.next_deadline() or 0.0)  # the first check after reading again
    assert not b.failed
    start = b.next_deadline()
    assert start is not None
    b.handle_timer(start)
    assert not b.failed  # a full timeout from there
    b.handle_timer(start + 10.0)
    assert "keepalive failed: no answer to a ping" in str(one(b.events(), ce.Failed).error)


def test_while_we_do_not_read_we_ping_and_the_peers_pings_show_it_alive() -> None:
    """Without credit, a session that does not read pings every min(interval, timeout / 2):
    the answers wait unread, but the peer (whose own ping we cannot answer now) counts our
    pings as signs of life. The heartbeat stops once we read again."""
    a, b, x, y = streamux_pair()
    stop_reading(a, b, x, 1.0)
    assert b.next_deadline() == 6.0  # 1 + min(15, 10 / 2)
    b.handle_timer(6.0)
    heartbeat = drain(b)
    assert heartbeat  # a ping (an empty terminated request)
    assert b.next_deadline() == 11.0
    # The peer's keepalive: its ping left, b does not answer (not reading), but b's
    # heartbeat reaches it: no verdict against b.
    a.handle_timer(15.0)
    drain(a)
    b.handle_timer(16.0)
    a.receive_data(drain(b), 16.0)
    a.handle_timer(25.0)
    assert not a.failed and not of(a.events(), ce.Failed)
    assert a.next_deadline() == 40.0  # the next keepalive ping, one interval on
    b.consumed(y, 5001)
    assert b.reading
    b.handle_timer(21.0)
    assert b.liveness.heartbeat_at is None  # no heartbeat once reading


def test_the_peers_pings_are_no_answer_on_formats_with_credit() -> None:
    """yamux has credit: a peer that pings but never answers ours is not reading what it
    granted us; its pings are no sign of life there."""
    a, b = pair("yamux", **KEEPALIVE)
    keepalive_ping(a, 15.0)
    b.ping(16.0)
    a.receive_data(drain(b), 16.0)
    a.handle_timer(25.0)
    assert "no answer to a ping within 10 s" in str(one(a.events(), ce.Failed).error)


def test_a_ping_the_peer_has_not_taken_is_judged_by_stall_timeout() -> None:
    """Our ping waits behind bytes the peer has not taken (the socket's unsent bytes): no
    keepalive verdict. Without credit (Streamux) the peer may take none of them for up to
    stall_timeout (120 s by default): it is applying backpressure; then the session ends,
    saying that the peer stopped reading."""
    a, _b, _x, _y = streamux_pair()
    taken = a.liveness.bytes_out - 500_000  # what the peer took: 500,000 bytes wait in our socket
    a.socket_paused(True, 500_000)
    a.handle_timer(15.0, 500_000)
    drain(a)  # the ping is queued behind them: not taken
    for t in (25.0, 75.0, 134.0):
        a.handle_timer(t, a.liveness.bytes_out - taken)
        assert not a.failed
    a.handle_timer(135.0, a.liveness.bytes_out - taken)
    error = str(one(a.events(), ce.Failed).error)
    assert "the peer has taken none of our bytes (our ping among them) for 120 s (stall_timeout=120)" in error


def test_progress_on_our_bytes_keeps_the_wait_going_and_stall_timeout_is_an_option() -> None:
    """A peer that takes our bytes slowly is never stalled; one that stops taking them for
    stall_timeout is. The ping judged once out, from then on."""
    a, _b, _x, _y = streamux_pair(stall_timeout=30.0)
    taken = a.liveness.bytes_out - 500_000
    a.socket_paused(True, 500_000)
    a.handle_timer(15.0, 500_000)
    drain(a)
    t = 15.0
    while a.liveness.bytes_out - taken > 0:  # 10,000 bytes every 10 s: 500 s of slow progress
        t += 10.0
        taken = min(a.liveness.bytes_out, taken + 10_000)
        a.handle_timer(t, a.liveness.bytes_out - taken)
        assert not a.failed
    # Taken at t: the answer is due within the timeout from there.
    a.handle_timer(t + 9.0, 0)
    assert not a.failed
    a.handle_timer(t + 10.0, 0)
    assert "no answer to a ping within 10 s" in str(one(a.events(), ce.Failed).error)


def test_a_keepalive_ping_sent_while_the_socket_is_paused_waits_to_be_taken() -> None:
    """The socket takes nothing when the keepalive ping is queued: it is not yet out, so
    the wait for its answer starts only once the peer has taken it."""
    a, _b = pair("yamux", **KEEPALIVE)
    a.socket_paused(True, 1000)
    a.handle_timer(15.0, 1000)
    a.socket_paused(False, 0)
    drain(a)
    a.handle_timer(25.0, 0)  # taken since, at most: a full timeout from now
    assert not a.failed and a.next_deadline() == 35.0
    a.handle_timer(35.0, 0)
    assert "no answer to a ping within 10 s" in str(one(a.events(), ce.Failed).error)


def test_pings_skip_a_beat_when_every_request_id_is_in_flight() -> None:
    """Streamux pings consume request ids until answered: with every id in flight, a
    heartbeat or a keepalive ping is skipped (the keepalive tries again an interval later),
    not an error."""
    a, b, x, _y = streamux_pair(streamux_id_bits=(1, 1, 1))
    stop_reading(a, b, x, 1.0)
    for t in (6.0, 11.0, 16.0, 21.0):
        b.handle_timer(t)
        drain(b)
    assert not b.failed
