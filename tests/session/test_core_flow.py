"""The session core's flow and memory bounds, driven with bytes and application calls: write
pause/resume by a channel's marks and by the session's unsent budget, credit on consumption,
the memory budget, and every reason reading from the peer pauses (_BUDGET, _BACKLOG,
_SLOW_READER, _CONTROLS) with the ``send_timeout`` that ends a stall."""

from __future__ import annotations

from polymux.exceptions import ChannelOverflow, SessionClosed
from polymux.session import events as ce
from polymux.wire import mplex as mwire, yamux as ywire

from .corekit import core, drain, of, one, open_to, pair, pump, received


# -- the writer's marks and the session's unsent budget ------------------------------------------


def test_a_writer_pauses_above_its_high_mark_and_resumes_at_its_low_mark() -> None:
    """write() says pause once the channel holds more than write_buffer_high unsent; the
    core says resume (WriteResumed) only once sending took it down to the low mark."""
    a, b = pair("yamux", write_buffer_high=4096, send_frame=1024, batch_bytes=1024)
    x, _ = open_to(a, b)
    assert a.write(x, bytes(4096)) is False  # at the mark, not above
    assert a.write(x, b"!") is True
    assert a.write(x, b"!") is False  # already paused: said once
    while True:
        assert a.data_to_send(), "sent everything without a resume"
        if of(a.events(), ce.WriteResumed):
            assert a.channels[x].buffered <= 1024
            break
        assert a.channels[x].buffered > 1024  # not yet down to the low mark: still paused


def test_set_write_limits_pauses_or_resumes_at_once() -> None:
    """Lowering a channel's high mark below what it holds pauses it (True); raising the low
    mark above it resumes it (a WriteResumed event, the call returns False); no change:
    None. A channel that is gone has no marks of its own: the session's defaults."""
    a, b = pair("yamux", write_buffer_high=4096)
    x, _ = open_to(a, b)
    a.write(x, bytes(1000))
    assert a.write_limits(x) == (1024, 4096)
    assert a.set_write_limits(x, 500, 100) is True
    assert a.set_write_limits(x, 500, 100) is None
    assert a.set_write_limits(x, 2000, 1500) is False
    assert one(a.events(), ce.WriteResumed).handle == x
    assert a.write_limits(x) == (1500, 2000)
    a.reset(x)
    assert a.set_write_limits(x, 1, 1) is None
    assert a.write_limits(x) == (1024, 4096)


def test_writers_are_held_by_the_sessions_unsent_budget_until_it_drains() -> None:
    """Over half of max_session_memory unsent in all, a writer under its own mark pauses too
    (held); held writers resume once the session's unsent bytes fall to a quarter."""
    a, b = pair(
        "mplex", max_session_memory=64 * 1024, write_buffer_high=16384, send_frame=1024, batch_bytes=2048
    )
    x, _ = open_to(a, b)
    y, _ = open_to(a, b)
    z, _ = open_to(a, b)
    assert a.write(x, bytes(8192)) is False
    assert a.write(y, bytes(8192)) is False
    assert a.write(z, bytes(20000)) is True  # its own mark: paused, not held
    assert not a.channels[z].held
    assert a.write(y, bytes(1)) is True  # under its mark, but 36,385 bytes unsent in all
    assert a.write(x, bytes(1)) is True
    assert a.budget.held_writers == {a.channels[x], a.channels[y]}
    resumed: list[int] = []
    while a.data_to_send():
        now_resumed = [e.handle for e in of(a.events(), ce.WriteResumed)]
        assert not now_resumed or a.budget.unsent <= a.budget.unsent_limit
        resumed += now_resumed
    assert sorted(resumed) == sorted([x, y, z])
    assert a.budget.unsent == 0 and a.budget.held == 0 and not a.budget.held_writers


def test_a_writer_drained_to_its_low_mark_stays_held_while_the_session_is_over_budget() -> None:
    """A writer paused by its own mark that drains to its low mark while other channels keep
    over half the budget unsent (their credit is spent) is held instead of resumed; it
    resumes once credit lets the others' bytes go."""
    a, b = pair("yamux", max_session_memory=1024 * 1024, write_buffer_high=16384)
    (p, q), (z, _) = open_to(a, b), open_to(a, b)
    a.write(p, bytes(800 * 1024))  # 256 KiB of window: 544 KiB stay unsent
    assert a.write(z, bytes(20000)) is True
    pump(a, b)
    assert a.channels[z].buffered == 0 and a.channels[z].held and a.channels[z].paused
    assert not of(a.events(), ce.WriteResumed)
    b.consumed(q, 256 * 1024)
    pump(a, b)
    b.consumed(q, 256 * 1024)
    pump(a, b)
    assert [e.handle for e in of(a.events(), ce.WriteResumed)] == [z]


def test_a_held_writer_reset_while_held_is_forgotten() -> None:
    """A reset channel's unsent bytes stop counting at once: the writers it held back
    resume. A held writer that is itself reset is dropped from the held set (no resume
    for a channel that is gone)."""
    a, b = pair("mplex", max_session_memory=64 * 1024, write_buffer_high=32 * 1024)
    x, _ = open_to(a, b)
    y, _ = open_to(a, b)
    w, _ = open_to(a, b)
    a.write(x, bytes(30_000))
    assert a.write(y, bytes(5_000)) is True and a.channels[y].held
    a.reset(x)  # 5,000 unsent: under a quarter of the budget, y resumes
    assert [e.handle for e in of(a.events(), ce.WriteResumed)] == [y]
    x = w
    assert a.write(x, bytes(30_000)) is True and a.channels[x].held
    a.reset(x)  # its own bytes take the session under the budget, but it is gone
    assert not of(a.events(), ce.WriteResumed)
    assert not a.budget.held_writers and a.budget.unsent == 5_000
    # A held writer reset while the others keep the session over its budget.
    x, _ = open_to(a, b)
    drain(a)
    z, _ = open_to(a, b)
    a.write(x, bytes(30_000))
    assert a.write(z, bytes(3_000)) is True and a.channels[z].held
    a.reset(z)
    assert not a.budget.held_writers and a.budget.unsent == 30_000


# -- credit on consumption ------------------------------------------------------------------------


def test_credit_goes_back_as_the_application_consumes() -> None:
    """yamux: a sender with a spent window waits (its channel leaves the scheduler); the
    receiver's consumed() returns the credit, and the rest goes out."""
    a, b = pair("yamux")
    x, y = open_to(a, b)
    a.write(x, bytes(300_000))
    pump(a, b)
    assert len(received(b.events(), y)) == 256 * 1024
    assert a.channels[x].buffered == 300_000 - 256 * 1024 and not a.has_output
    b.consumed(y, 200_000, now=0.5)
    pump(a, b, 0.5)
    assert len(received(b.events(), y)) == 300_000 - 256 * 1024
    assert a.channels[x].buffered == 0


def test_credit_that_reaches_a_channel_with_nothing_queued_sends_nothing() -> None:
    """Credit arriving for a channel that has nothing to send puts it in the scheduler for
    one empty turn, and it leaves again (no spin, no frame)."""
    a, b = pair("yamux")
    x, y = open_to(a, b)
    a.write(x, bytes(256 * 1024))  # the whole window
    pump(a, b)
    b.consumed(y, 256 * 1024)
    b.receive_data(b"", 0.0)
    a.receive_data(drain(b), 0.0)
    assert a.has_output  # in the ready queue
    assert a.data_to_send() == [] and not a.has_output


def test_a_write_to_a_channel_without_credit_waits_in_the_queue() -> None:
    """A write when the window is spent queues the channel; its turn sends nothing and it
    leaves the queue until credit comes."""
    a, b = pair("yamux")
    x, y = open_to(a, b)
    a.write(x, bytes(256 * 1024))
    pump(a, b)
    a.write(x, b"more")
    assert a.has_output and a.data_to_send() == [] and not a.has_output
    b.consumed(y, 256 * 1024)
    pump(a, b)
    assert received(b.events(), y).endswith(b"more")
    # Credit that arrives while the channel is still queued (its turn has not come yet)
    # leaves it queued once.
    a.write(x, bytes(256 * 1024 - 4))
    pump(a, b)
    a.write(x, b"again")
    b.consumed(y, 256 * 1024)
    a.receive_data(drain(b), 0.0)
    assert [ch.handle for ch in a.scheduler.ready] == [x]
    pump(a, b)
    assert received(b.events(), y).endswith(b"again")


def test_consumed_for_a_gone_channel_still_returns_credit_and_extra_counts_are_ignored() -> None:
    """consumed() for a channel the core forgot goes straight to the engine (what the
    reader held is released on the wire); more than the channel holds is clipped; zero is
    nothing."""
    a, b = pair("mstream-v3", receive_window=64 * 1024)
    x, y = open_to(a, b)
    a.write(x, bytes(1000))
    pump(a, b)
    b.events()
    b.consumed(y, 0)
    b.consumed(y, 5000)  # clipped to 1000
    assert b.channels[y].unconsumed == 0 and b.budget.held == 0
    b.consumed(y, 10)  # nothing left: ignored
    b.consumed(12345, 10)  # unknown: the engine ignores it too
    assert b.budget.held == 0


def test_a_reader_waiting_for_more_than_it_holds_credits_all_it_holds() -> None:
    """reader_waiting(): the reader needs more than it holds; everything it holds is
    credited (not only the ack_min batches), so a readexactly() beyond the window cannot
    deadlock."""
    a, b = pair("mstream-v3", receive_window=64 * 1024, ack_min=60 * 1024)
    x, y = open_to(a, b)
    a.write(x, bytes(64 * 1024 + 10))
    pump(a, b)
    assert b.channels[y].unconsumed == 64 * 1024
    b.reader_waiting(y)
    b.reader_waiting(4242)  # gone: nothing
    assert b.channels[y].unconsumed == 0
    pump(a, b)
    assert received(b.events(), y) == bytes(64 * 1024 + 10)
    b.consumed(y, 10)
    drain(b)
    b.reader_waiting(y)  # holds nothing now: no credit to send
    assert not b.has_output


# -- the memory budget -------------------------------------------------------------------------


def test_reading_pauses_over_the_memory_budget_and_resumes_at_three_quarters() -> None:
    """Unread plus unsent bytes over max_session_memory pause reading (_BUDGET); the session
    reads again once the application brought them down to three quarters."""
    a, b = pair("yamux", server={"max_session_memory": 300 * 1024})
    (x, y), (v, w) = open_to(a, b), open_to(a, b)
    a.write(x, bytes(200 * 1024))
    a.write(v, bytes(200 * 1024))  # within each stream's 256 KiB window
    pump(a, b)
    assert b.budget.held == 400 * 1024 and not b.reading
    b.consumed(y, 150 * 1024)  # 250 KiB held: still over 225 KiB
    assert not b.reading
    b.consumed(w, 30 * 1024)
    assert b.reading


def test_unsent_bytes_count_up_to_twice_the_high_mark_per_channel() -> None:
    """A writer that ignores drain() holds its bytes; while the socket takes nothing the
    budget counts them only up to twice write_buffer_high (the rest is the application's
    own), and releases them as sent. While the socket takes bytes they do not count (they
    may wait for credit that only reading brings)."""
    a, b = pair("mplex", write_buffer_high=1000)
    x, _ = open_to(a, b)
    a.write(x, bytes(1500))
    assert a.budget.held == 0 and a.budget.unsent_counted == 1500
    a.socket_paused(True, 0)
    assert a.budget.held == 1500
    a.write(x, bytes(1500))
    assert a.budget.held == 2000
    a.write(x, bytes(10))
    assert a.budget.held == 2000
    a.socket_paused(False, 0)
    drain(a)
    assert a.budget.held == 0 and a.budget.unsent == 0 and a.budget.unsent_counted == 0


# -- _BACKLOG: replies the peer does not read -------------------------------------------------


def test_a_peer_that_asks_for_replies_and_does_not_read_pauses_reading_then_times_out() -> None:
    """The socket is paused (the peer reads nothing) and the peer floods pings: past
    max_queued_control queued answers the session stops reading (_BACKLOG), and with no
    progress on the socket for send_timeout it ends."""
    a = core("yamux", max_queued_control=8, send_timeout=30.0)
    a.events()
    drain(a)
    a.socket_paused(True, 100_000)
    pings = b"".join(ywire.encode_header(ywire.Type.PING, ywire.Flag.SYN, 0, i) for i in range(1, 9))
    a.receive_data(pings, 1.0)
    assert a.reading  # 8 queued: at the bound
    a.receive_data(ywire.encode_header(ywire.Type.PING, ywire.Flag.SYN, 0, 9), 2.0)
    assert not a.reading
    assert a.next_deadline() == 32.0
    a.handle_timer(32.0, 100_000)
    failed = one(a.events(), ce.Failed)
    assert isinstance(failed.error, SessionClosed) and "send_timeout" in str(failed.error)
    assert a.failed and a.data_to_send() != []  # the last words: a go-away


def test_a_slow_reader_is_not_killed_by_send_timeout() -> None:
    """The same stall, but the socket's unsent bytes shrink between deadlines: the peer
    reads, slowly. The clock restarts from the new mark instead of ending the session; once
    the socket takes our bytes again, reading resumes."""
    a = core("yamux", max_queued_control=1, send_timeout=10.0)
    a.events()
    drain(a)
    a.socket_paused(True, 5000)
    a.receive_data(b"".join(ywire.encode_header(ywire.Type.PING, ywire.Flag.SYN, 0, i) for i in (1, 2)), 0.0)
    assert not a.reading and a.next_deadline() == 10.0
    a.handle_timer(10.0, 4000)  # the peer read 1000 bytes meanwhile
    assert not a.failed and a.next_deadline() == 20.0
    a.handle_timer(15.0, 4000)  # early: nothing due
    assert a.next_deadline() == 20.0
    a.socket_paused(False, 0)
    assert a.data_to_send() and a.reading  # the answers went out: reading resumes
    a.handle_timer(20.0, 0)  # the stall is over: nothing happens
    assert not a.failed and a.next_deadline() is None


def test_a_budget_stall_with_the_socket_paused_times_out() -> None:
    """Reading already paused by the memory budget, then the socket stops taking our bytes
    (the peer asks for data and does not read it): the send_timeout clock starts with the
    pause, and with no progress the session ends."""
    a, b = pair("yamux", server={"max_session_memory": 300 * 1024, "send_timeout": 5.0})
    (x, _), (v, _) = open_to(a, b), open_to(a, b)
    a.write(x, bytes(200 * 1024))
    a.write(v, bytes(200 * 1024))
    pump(a, b, 1.0)
    assert not b.reading and b.next_deadline() is None
    b.socket_paused(True, 70_000)
    assert b.next_deadline() == 6.0
    b.handle_timer(6.0, 70_000)
    assert "the peer sends but is not reading: 70000 bytes unsent" in str(one(b.events(), ce.Failed).error)


def test_send_timeout_none_waits_forever() -> None:
    """send_timeout=None: a stall never ends the session (no deadline)."""
    a = core("yamux", max_queued_control=1, send_timeout=None)
    drain(a)
    a.socket_paused(True, 10)
    a.receive_data(b"".join(ywire.encode_header(ywire.Type.PING, ywire.Flag.SYN, 0, i) for i in (1, 2)), 0.0)
    assert not a.reading and a.next_deadline() is None


def test_socket_paused_without_a_stall_starts_no_clock() -> None:
    """A paused socket alone (reading goes on) is no stall; nor is a stall once the
    connection is lost."""
    a = core("yamux", send_timeout=5.0)
    a.socket_paused(True, 10)
    assert a.next_deadline() is None
    a.connection_lost(None)
    a.pressure.block(8, True)  # _BUDGET after the end: no clock either
    assert a.next_deadline() is None


# -- _SLOW_READER: formats without credit --------------------------------------------------------


def mplex_data(stream: int, data: bytes) -> bytes:
    """mplex MessageInitiator frame for the peer's stream ``stream`` (sent by the opener)."""
    return mwire.encode_header(stream, mwire.Flag.MESSAGE_INITIATOR, len(data)) + data


def test_a_full_reader_blocks_the_connection_until_it_catches_up() -> None:
    """mplex has no credit: a channel holding more than receive_window unread stops the
    whole connection (slow_reader="block"); it reads again once the reader is down to
    half the window."""
    a, b = pair("mplex", server={"receive_window": 4096})
    x, y = open_to(a, b)
    a.write(x, bytes(5000))
    pump(a, b)
    assert not b.reading and b.channels[y].slow
    a.write(x, bytes(1000))  # bytes read before the pause took effect
    pump(a, b)
    assert b.channels[y].unconsumed == 6000 and b.pressure.pausers == 1
    b.consumed(y, 3000)  # 3000 left: above half the window
    assert not b.reading
    b.consumed(y, 1000)
    assert b.reading and not b.channels[y].slow


def test_slow_reader_reset_with_no_grace_resets_the_full_channel_at_once() -> None:
    """slow_reader="reset", slow_reader_timeout=0: the channel that overflows is reset at
    once (its reader loses what it holds: drop_unread), the peer gets the reset, reading
    goes on."""
    a, b = pair("mplex", server={"receive_window": 4096, "slow_reader": "reset", "slow_reader_timeout": 0})
    x, y = open_to(a, b)
    a.write(x, bytes(5000))
    pump(a, b)
    done = one(b.events(), ce.Finished)
    assert done.handle == y and done.drop_unread and isinstance(done.error, ChannelOverflow)
    assert "reader fell behind: 5000 bytes unread (receive_window=4096" in str(done.error)
    assert b.reading and b.budget.held == 0
    assert isinstance(one(a.events(), ce.Finished).error, Exception)


def test_slow_reader_reset_waits_for_the_overflow_deadline() -> None:
    """slow_reader="reset" with a grace: the connection blocks; a reader that catches up in
    time keeps its channel, one that falls behind again restarts the clock, and one still
    full at its deadline is reset."""
    a, b = pair("mplex", server={"receive_window": 4096, "slow_reader": "reset", "slow_reader_timeout": 5.0})
    x, y = open_to(a, b)
    a.write(x, bytes(5000))
    pump(a, b, 0.0)
    assert not b.reading and b.next_deadline() == 5.0
    b.consumed(y, 5000, now=1.0)
    assert b.reading
    a.write(x, bytes(5000))
    pump(a, b, 3.0)  # full again at 3.0: a new deadline at 8.0
    assert not b.reading
    b.handle_timer(5.0)  # the first deadline: full, but not for 5 s
    assert y in b.channels and b.next_deadline() == 8.0
    b.reader_waiting(y)  # the reader asks for more: the hold is lifted
    assert b.reading
    b.handle_timer(8.0)
    assert y in b.channels  # no longer slow at its deadline: kept
    a.write(x, bytes(5000))
    pump(a, b, 9.0)
    b.handle_timer(14.0)
    done = one(b.events(), ce.Finished)
    assert done.drop_unread and "for 5 s" in str(done.error)
    assert b.reading


def test_a_plain_protocol_pausing_its_reading_pauses_the_connection_without_credit() -> None:
    """reading_paused() on a format without credit pauses reading the connection, and the
    resume resumes it (slow_reader="block"); with slow_reader="reset" the pause starts the
    overflow clock instead. On a format with credit it changes nothing here (the driver
    withholds the credit)."""
    a, b = pair("mplex")
    _x, y = open_to(a, b)
    b.reading_paused(y, True)
    b.reading_paused(y, True)  # no change
    assert not b.reading
    b.reading_paused(y, False)
    assert b.reading
    b.reading_paused(999, True)  # gone
    b.reading_paused(y, True)
    b.reset(y)  # a paused channel that ends lifts its pause
    assert b.reading

    c, d = pair("mplex", server={"slow_reader": "reset", "slow_reader_timeout": 2.0})
    _x, y = open_to(c, d)
    d.reading_paused(y, True)
    assert not d.reading and d.next_deadline() == 2.0
    d.handle_timer(2.0)
    assert one(d.events(), ce.Finished).drop_unread and d.reading

    e, f = pair("yamux")
    _x, y = open_to(e, f)
    f.reading_paused(y, True)
    assert f.reading


# -- _CONTROLS: omnistreams control messages -------------------------------------------------


def test_unread_control_messages_pause_reading_until_half_are_taken() -> None:
    """omnistreams: 1,024 control messages not taken by the application stop reading; the
    session reads again once half of them were taken."""
    a, b = pair("omnistreams")
    for i in range(1024):
        a.send_control(b"%d" % i)
    pump(a, b)
    assert len(of(b.events(), ce.ControlArrived)) == 1024
    assert not b.reading
    taken = [b.take_control() for _ in range(511)]
    assert taken[0] == b"0" and not b.reading
    assert b.take_control() == b"511" and b.reading
    while b.take_control() is not None:
        pass
    assert b.take_control() is None and b.reading
