"""The session core's side of the data plane: a streamed channel's inbox (``stream``), the
budget counted per read, consumption reported (``report``) as credit and budget, reading
paused until every consumed byte is reported, the slow-reader policy from the inboxes, and
data that came as an event going into the same inbox."""

from __future__ import annotations

from polymux.session import events as ce
from polymux.session.budget import BUDGET, CONTROLS, SLOW_READER, Pressure
from polymux.wire import yamux as ywire

from .corekit import drain, of, open_to, pair, pump


def test_a_streamed_channel_gets_its_data_with_no_event_and_credit_at_the_step() -> None:
    a, b = pair("yamux")
    x, y = open_to(a, b)
    inbox = b.stream(y, owner="reader")
    assert inbox is not None and inbox.owner == "reader" and b.channels[y].streamed
    step = inbox.report_at
    a.write(x, bytes(step - 1))
    pump(a, b)
    assert not of(b.events(), ce.Data)  # into the inbox, no event
    assert inbox.size == step - 1 and b.budget.unread == step - 1
    inbox.take(1 << 20)
    assert b.plane.reports == []  # below the step: nothing to credit yet
    a.write(x, bytes(1))
    pump(a, b)
    inbox.take(1 << 20)
    assert b.plane.reports == [inbox]
    b.report(1.0)
    assert b.budget.unread == 0 and inbox.pending == 0
    update = ywire.Decoder(1 << 20).feed(drain(b))
    assert [f.type for f in update] == [ywire.Type.WINDOW_UPDATE] and update[0].length == step


def test_a_report_for_nothing_or_for_a_channel_gone_only_credits() -> None:
    a, b = pair("yamux")
    x, y = open_to(a, b)
    inbox = b.stream(y, owner=None)
    assert inbox is not None
    b.plane.report(inbox)  # nothing pending: nothing done
    b.report(0.0)
    assert drain(b) == b""
    a.write(x, bytes(1000))
    pump(a, b)
    inbox.take(1000)
    b.reset(y)  # the channel goes; its reader took the bytes first
    b.events()
    drain(b)
    b.plane.report(inbox)
    b.report(0.0)  # no channel: credit only (the engine has none to send either)
    assert inbox.pending == 0 and drain(b) == b""
    assert b.stream(y, owner=None) is None


def test_a_channel_closed_before_its_reader_came_drops_what_arrives() -> None:
    a, b = pair("yamux")
    x, y = open_to(a, b)
    b.close_channel(y)
    inbox = b.stream(y, owner=None)
    assert inbox is not None
    a.write(x, b"dropped")
    pump(a, b)
    assert inbox.size == 0 and b.budget.unread == 0


def test_reading_paused_reports_every_consumed_byte_until_it_resumes() -> None:
    a, b = pair("yamux", server={"max_session_memory": 64 * 1024})
    x, y = open_to(a, b)
    inbox = b.stream(y, owner=None)
    assert inbox is not None
    a.write(x, bytes(10_000))
    pump(a, b)
    inbox.take(5_000)  # consumed, below the step: not reported
    assert inbox.pending == 5_000 and b.plane.reports == []
    b.pressure.block(CONTROLS, True)  # reading pauses: what was consumed is reported now
    assert b.plane.eager and b.plane.reports == [inbox]
    b.report(0.0)
    inbox.take(10)
    assert b.plane.reports == [inbox]  # and every byte from now on
    b.pressure.block(CONTROLS, False)
    assert not b.plane.eager


def test_an_inbox_past_the_receive_window_holds_the_connection_until_read() -> None:
    """No credit on the wire (mplex): the inbox past receive_window applies the slow-reader
    policy (block: reading pauses), and reading resumes once the reader took it down."""
    a, b = pair("mplex", receive_window=8 * 1024)
    x, y = open_to(a, b)
    inbox = b.stream(y, owner=None)
    assert inbox is not None
    a.write(x, bytes(5_000))
    pump(a, b)
    assert not b.pressure.bits & SLOW_READER
    a.write(x, bytes(5_000))
    pump(a, b)
    assert b.pressure.bits & SLOW_READER and b.channels[y].slow
    a.write(x, bytes(100))  # a second time past it: already slow
    pump(a, b)
    b.events()
    while inbox.size:
        inbox.take(1 << 20)
    b.report(0.0)
    assert not b.channels[y].slow and not b.pressure.bits & SLOW_READER


def test_data_an_engine_reports_as_an_event_goes_into_the_inbox_too() -> None:
    """yamux data with a FIN on the same frame is an event of the engine: it lands in the
    streamed channel's inbox all the same, before the end."""
    a, b = pair("yamux")
    _x, y = open_to(a, b)
    inbox = b.stream(y, owner=None)
    assert inbox is not None
    stream_id = int(b.engine.describe(y).split()[1])
    frame = ywire.encode_frame(ywire.Frame(ywire.Type.DATA, ywire.Flag.FIN, stream_id, 3, b"end"))
    b.receive_data(frame, 0.0)
    events = b.events()
    assert not of(events, ce.Data) and of(events, ce.Ended)
    assert bytes(inbox.parts[0]) == b"end" and b.budget.unread == 3


def test_pressure_without_a_listener_for_changes() -> None:
    class Listener:
        def reading_stopped(self) -> None:
            return

        def stalled(self) -> None:
            return

    pressure = Pressure()
    pressure.listener = Listener()
    pressure.block(BUDGET, True)
    pressure.block(BUDGET, False)
    assert pressure.bits == 0
