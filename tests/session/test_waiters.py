"""What the application's tasks wait for (session/waiters.py), the policy both drivers share:
who is woken, in which order, with which value or error; what becomes of a turn, an answer
or an incoming channel given to a task that left before taking it; and the end of the
session, after which every wait fails with the same SessionClosed. Real cores, a signal
that counts its wake-ups, no event loop."""

from __future__ import annotations

from typing import Any

import pytest

from polymux.exceptions import ChannelRejected, LimitExceeded, SessionClosed
from polymux.session import SessionCore, events as ce
from polymux.session.waiters import Line, Waiter, Waiters

from .corekit import core, of, open_to, pair, pump
from .test_dispatch import Flag


def waiters(c: SessionCore) -> Waiters[Flag, str, str]:
    return Waiters(c, Flag)


def queued(line: Line[Flag]) -> Waiter[Flag, None]:
    """A task that finds nothing joins the line."""
    got = line.attempt(lambda: None)
    assert isinstance(got, Waiter)
    return got


def woken(*ws: Waiter[Flag, Any]) -> list[int]:
    return [w.signal.woken for w in ws]


def raises(waiter: Waiter[Flag, Any]) -> BaseException:
    with pytest.raises(BaseException) as info:
        waiter.result()
    return info.value


# -- one waiter per key: opens, pings, requests, pairs ------------------------------------------


def test_a_keyed_waiter_gets_its_value_or_its_error_once() -> None:
    w = waiters(core("yamux"))
    ping = w.pings.wait(7)
    w.pings.settle(8, 1.0)  # nobody waits for it
    assert 7 in w.pings and woken(ping) == [0]
    w.pings.settle(7, 0.25)
    w.pings.settle(7, 9.0)  # settled already
    assert woken(ping) == [1] and ping.result() == 0.25 and 7 not in w.pings
    opening = w.opens.wait(3)
    rejected = ChannelRejected("yamux", "channel 3", "no")
    w.opens.fail(3, rejected)
    w.opens.fail(3, LimitExceeded("again"))  # failed already
    assert woken(opening) == [1] and raises(opening) is rejected
    given_up = w.opens.wait(5)
    given_up.leave()  # (the driver rescinds the open itself)
    assert 5 not in w.opens


def test_a_ping_given_up_is_forgotten() -> None:
    c = core("yamux")
    w = waiters(c)
    opaque = c.ping(0.0)
    ping = w.pings.wait(opaque)
    ping.leave()
    ping.leave()  # once is enough
    assert opaque not in w.pings and opaque not in c.liveness.pings


def test_a_request_given_up_is_cancelled_on_the_wire() -> None:
    a, b = pair("yamux")
    w = waiters(a)
    handle = a.request("", b"question")
    answer = w.requests.wait(handle)
    pump(a, b)
    (incoming,) = of(b.events(), ce.Incoming)
    answer.leave()
    assert handle not in a.requests and handle not in a.channels
    assert [e.handle for e in of(a.events(), ce.Finished)] == [handle]
    pump(a, b)
    assert incoming.handle not in b.channels  # the reset reached the peer


def test_an_answer_taken_or_abandoned_after_it_came_is_not_cancelled() -> None:
    a, _b = pair("yamux")
    w = waiters(a)
    handle = a.request("", b"q")
    answer = w.requests.wait(handle)
    w.requests.settle(handle, [b"a"])
    answer.leave()  # too late: nothing to cancel, nothing to reset
    assert handle in a.channels
    answer.leave()
    assert answer.result() == [b"a"]
    answer.leave()  # taken: nothing


def test_a_pair_half_comes_with_its_channel_reset_if_nobody_takes_it() -> None:
    """The peer's half of a stream pair is given with the pair; a task that left before
    taking it has it reset, as has an answer nobody waits for."""
    a, b = pair("mplex")
    w = waiters(b)
    (_x1, y1), (_x2, y2), (_x3, y3) = (open_to(a, b) for _ in range(3))
    kept, dropped = w.pairs.wait(1), w.pairs.wait(2)
    w.pairs.settle(1, "pair 1", y1)
    w.pairs.settle(2, "pair 2", y2)
    w.pairs.settle(3, "pair 3", y3)  # nobody waits: reset at once
    assert y3 not in b.channels
    dropped.leave()
    assert y2 not in b.channels and kept.result() == "pair 1" and y1 in b.channels
    failed = w.pairs.wait(4)
    w.pairs.fail(4, LimitExceeded("x"))
    failed.leave()  # an error, not a channel: nothing to reset
    assert y1 in b.channels


# -- the line: room to open, in order -------------------------------------------------------------


def test_opens_beyond_max_unacked_opens_wait_in_order_one_turn_per_room() -> None:
    a, _b = pair("yamux", max_unacked_opens=2)
    w = waiters(a)
    room = w.room
    first = [room.attempt(a.open_channel) for _ in range(2)]
    assert all(isinstance(h, int) for h in first)
    waiting = [room.attempt(a.open_channel) for _ in range(3)]
    assert all(isinstance(x, Waiter) for x in waiting)
    b1, b2, b3 = (x for x in waiting if isinstance(x, Waiter))
    assert list(room.waiting) == [b1, b2, b3] and woken(b1, b2, b3) == [0, 0, 0]
    a.reset(first[0])  # ends un-acknowledged: room for one
    (room_event,) = of(a.events(), ce.RoomToOpen)
    w.room_to_open(room_event.error, room_event.everyone)
    assert woken(b1, b2, b3) == [1, 0, 0] and room.granted == [b1]
    # A newcomer goes behind those who came first, and behind the turn not yet used.
    late = room.attempt(a.open_channel)
    assert isinstance(late, Waiter) and list(room.waiting) == [b2, b3, late]
    b1.result()
    assert not room.granted
    handle = room.attempt(a.open_channel, turn=True)
    assert isinstance(handle, int) and a.room_to_open == 0


def test_a_turn_that_finds_no_room_keeps_its_place_at_the_front() -> None:
    a, _b = pair("yamux", max_unacked_opens=1)
    w = waiters(a)
    room = w.room
    room.attempt(a.open_channel)
    b1, b2 = queued(room), queued(room)
    room.serve(everyone=True)  # (the peer is going away: every open tries, and fails)
    assert woken(b1, b2) == [1, 1]
    b1.result()
    again = room.attempt(a.open_channel, turn=True)  # there is still no room
    assert list(room.waiting) == [again] and room.granted == [b2]


def test_a_turn_left_unused_passes_to_the_next() -> None:
    """A task given room that leaves without opening (cancelled), or whose open fails
    otherwise, passes its turn on; one that leaves while waiting just goes."""
    a, _b = pair("yamux", max_unacked_opens=1)
    w = waiters(a)
    room = w.room
    opened = room.attempt(a.open_channel)
    assert isinstance(opened, int)
    b1, b2, b3, b4 = (queued(room) for _ in range(4))
    b2.leave()
    assert list(room.waiting) == [b1, b3, b4]
    a.reset(opened)
    w.room_to_open(None, False)
    assert woken(b1, b3, b4) == [1, 0, 0]
    b1.leave()  # cancelled with its turn
    assert woken(b3, b4) == [1, 0] and room.granted == [b3]
    b3.result()
    with pytest.raises(LimitExceeded, match="max_channels"):
        room.attempt(lambda: a.offers.check_open(False) or _too_many(), turn=True)
    assert woken(b4) == [1]  # the room was not used: the next one tries


def _too_many() -> int:
    raise LimitExceeded("yamux: max_channels=1 channels are open")


def test_an_attempt_out_of_turn_that_fails_passes_nothing_on() -> None:
    a, _b = pair("yamux", max_unacked_opens=1)
    room = waiters(a).room
    with pytest.raises(LimitExceeded):
        room.attempt(_too_many)
    assert not room.waiting and not room.granted


def test_an_open_not_acknowledged_in_time_fails_the_first_waiting_open() -> None:
    a, _b = pair("yamux", max_unacked_opens=1, stream_open_timeout=5.0)
    w = waiters(a)
    room = w.room
    room.attempt(a.open_channel)
    b1, b2 = queued(room), queued(room)
    a.handle_timer(6.0)
    (room_event,) = of(a.events(), ce.RoomToOpen)
    w.room_to_open(room_event.error, room_event.everyone)
    error = raises(b1)
    assert isinstance(error, LimitExceeded) and "stream_open_timeout=5 s" in str(error)
    assert woken(b2) == [1]  # and the room it freed goes to the next
    w.room_to_open(LimitExceeded("x"), False)  # (no one waits: nothing fails)
    assert b2.result() is None


# -- the line: control messages -----------------------------------------------------------------


def test_control_messages_go_to_their_readers_in_order() -> None:
    a, b = pair("omnistreams")
    w = waiters(b)
    control = w.control
    r1, r2 = queued(control), queued(control)
    a.send_control(b"one")
    a.send_control(b"two")
    pump(a, b)
    assert len(of(b.events(), ce.ControlArrived)) == 2
    control.serve()
    assert woken(r1, r2) == [1, 1]
    r2.result()
    assert control.attempt(b.take_control, turn=True) == b"one"
    r1.result()
    assert control.attempt(b.take_control, turn=True) == b"two"
    # Nothing waits: a reader takes it at once; a reader that comes while a message is
    # there and turns are given goes behind them, and gets its own turn at once.
    a.send_control(b"three")
    a.send_control(b"four")
    pump(a, b)
    r3 = queued(control)
    assert woken(r3) == [1]
    r4 = control.attempt(b.take_control)
    assert isinstance(r4, Waiter) and woken(r4) == [1]
    r3.result()
    r4.result()
    assert [control.attempt(b.take_control, turn=True) for _ in range(2)] == [b"three", b"four"]
    assert control.attempt(b.take_control) is not None  # nothing: a waiter


def test_a_control_message_given_to_a_reader_that_left_goes_to_the_next() -> None:
    a, b = pair("omnistreams")
    control = waiters(b).control
    r1, r2 = queued(control), queued(control)
    a.send_control(b"only")
    pump(a, b)
    control.serve()
    assert woken(r1, r2) == [1, 0]
    r1.leave()  # cancelled before it ran
    assert woken(r2) == [1]
    r2.result()
    assert control.attempt(b.take_control, turn=True) == b"only"


# -- incoming channels --------------------------------------------------------------------------


def test_incoming_channels_wait_in_order_for_whoever_takes_them() -> None:
    a, b = pair("mstream-v3", server_handler=False)
    w = waiters(b)
    incoming = w.incoming
    (_x1, y1), (_x2, y2), (_x3, y3) = (open_to(a, b, name) for name in ("one", "two", "three"))
    assert b.table.untaken == 3
    incoming.add("one", y1, "chan one")
    incoming.add("two", y2, "chan two")
    assert incoming.take("two") == "chan two"  # by name
    assert incoming.take() == "chan one"
    assert b.table.untaken == 1
    by_name, anyone = incoming.take("three"), incoming.take()
    assert isinstance(by_name, Waiter) and isinstance(anyone, Waiter)
    incoming.add("three", y3, "chan three")  # the first that wants it
    assert woken(by_name, anyone) == [1, 0] and b.table.untaken == 1
    assert by_name.result() == "chan three" and b.table.untaken == 0


def test_an_incoming_channel_given_to_a_task_that_left_is_not_lost() -> None:
    """It goes to the next task that wants it, or back to the front of the backlog."""
    a, b = pair("mstream-v3", server_handler=False)
    incoming = waiters(b).incoming
    (_x1, y1), (_x2, y2), (_x3, y3) = (open_to(a, b, name) for name in ("x", "y", "z"))
    first, gone, named_z, second = (incoming.take(n) for n in (None, None, "z", None))
    assert all(isinstance(t, Waiter) for t in (first, gone, named_z, second))
    assert isinstance(first, Waiter) and isinstance(gone, Waiter) and isinstance(second, Waiter)
    gone.leave()  # left while waiting: just goes
    incoming.add("x", y1, "chan x")
    first.leave()  # left with it: to the next task that wants it
    assert woken(first, second) == [1, 1]
    assert second.result() == "chan x" and b.table.untaken == 2
    incoming.add("y", y2, "chan y")
    incoming.add("z", y3, "chan z")
    assert isinstance(named_z, Waiter) and woken(named_z) == [1]
    late = incoming.take()
    assert late == "chan y"
    named_z.leave()  # nobody else wants it: back in the backlog
    assert incoming.take() == "chan z" and b.table.untaken == 0


def test_a_channel_is_awaited_until_the_session_ends() -> None:
    """Not only until the peer's go-away or our close: a server that stopped taking
    channels then would close under the peer's own close."""
    _a, b = pair("yamux", server_handler=False)
    incoming = waiters(b).incoming
    b.close()
    assert isinstance(incoming.take(), Waiter)


# -- the end ------------------------------------------------------------------------------------


def test_at_the_end_every_wait_fails_with_the_same_session_closed() -> None:
    a, _b = pair("omnistreams", max_unacked_opens=1, server_handler=False)
    w = waiters(a)
    opening = w.opens.wait(1)
    ping = w.pings.wait(2)
    answer = w.requests.wait(3)
    half = w.pairs.wait(4)
    accept = w.incoming.take()
    # Room for one open (omnistreams acknowledges none: max_unacked_opens is the room):
    # the first has a turn it has not used yet, the second waits.
    turn, behind = queued(w.room), queued(w.room)
    assert woken(turn, behind) == [1, 0]
    # What was given and not yet taken stays given: an answer, a control message's turn.
    answered = w.requests.wait(5)
    w.requests.settle(5, [b"done"])
    reader, other_reader = queued(w.control), queued(w.control)
    a.controls.arrived(b"kept")
    w.control.serve()
    assert woken(reader, other_reader) == [1, 0]
    a.connection_lost(ConnectionResetError("reset by peer"))
    a.events()
    w.lost()
    w.lost()  # once
    failed = [opening, ping, answer, half, accept, turn, behind, other_reader]
    errors = [raises(x) for x in failed]
    assert all(type(e) is SessionClosed for e in errors)
    message = f"omnistreams: session ended: {a.error}"
    assert message.startswith("omnistreams: session ended: omnistreams: connection lost: reset by peer")
    assert {str(e) for e in errors} == {message}
    assert all(e.__cause__ is a.error for e in errors) and len({id(e) for e in errors}) == len(errors)
    assert answered.result() == [b"done"] and reader.result() is None
    assert w.control.attempt(a.take_control, turn=True) == b"kept"
    # Every wait begun later fails the same way (what was there is still taken first).
    for begin in (
        lambda: w.opens.wait(9),
        lambda: w.pings.wait(9),
        lambda: queued(w.room),
        lambda: w.control.attempt(a.take_control),
        lambda: w.incoming.take(),
    ):
        with pytest.raises(SessionClosed) as info:
            begin()
        assert str(info.value) == message
    w.incoming.add("came before the end", 7, "chan")
    assert w.incoming.take() == "chan"


def test_a_ping_not_answered_in_time() -> None:
    w = waiters(core("yamux", keepalive_timeout=2.5))
    error = w.ping_timed_out()
    assert isinstance(error, SessionClosed)
    assert str(error) == "yamux: no answer to a ping within 2.5 s"
