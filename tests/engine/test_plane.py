"""The data plane's receiving half (``polymux.engine.plane``): data frames into inboxes, the
inbox's reads and counts, consumption reported at the format's credit step, and the
engine's hooks (``attach_inbox``, ``credit_step``), driven with bytes: no session core."""

from __future__ import annotations

from polymux.config import SessionConfig
from polymux.engine import events as ev
from polymux.engine.flow import MessageWindow
from polymux.engine.plane import KEEP_VIEW, NO_CREDIT_STEP, DataRuns, Inbox, Plane
from polymux.formats import make_engine
from polymux.wire import mplex, yamux


class _Record:
    """What DataRuns reads of an engine record."""

    def __init__(self, handle: int, inbox: Inbox | None) -> None:
        self.handle = handle
        self.inbox = inbox


def _inbox(plane: Plane | None = None, handle: int = 1) -> Inbox:
    return Inbox(plane or Plane(), handle)


# -- DataRuns: where a data frame goes ---------------------------------------------------------


def test_frames_of_a_channel_with_an_inbox_go_into_it_without_an_event() -> None:
    runs = DataRuns()
    inbox = _inbox()
    read = bytes(range(200)) * 5  # 1,000 bytes
    view = memoryview(read)
    runs.add(_Record(1, inbox), view[0:400], 400)  # >= 1/KEEP_VIEW of the read: kept as a view
    runs.add(_Record(1, inbox), view[400:410], 10)  # smaller: copied
    runs.add(_Record(1, inbox), b"xyz", 3)  # bytes: as they are
    assert runs.take_events() == []
    first, second, third = inbox.parts
    assert isinstance(first, memoryview) and first.obj is read
    assert second.__class__ is bytes and second == read[400:410]
    assert third == b"xyz"
    assert inbox.size == inbox.unconsumed == 413 and runs.received == 413
    assert 400 * KEEP_VIEW >= len(read) > 10 * KEEP_VIEW


def test_a_view_of_a_mutable_buffer_is_copied() -> None:
    runs = DataRuns()
    inbox = _inbox()
    buffer = bytearray(b"abcdef")
    runs.add(_Record(1, inbox), memoryview(buffer)[:6], 6)
    buffer[0] = 0  # the buffer changes: the inbox's bytes do not
    assert bytes(inbox.parts[0]) == b"abcdef"


def test_frames_of_channels_without_an_inbox_become_one_event_per_run() -> None:
    runs = DataRuns()
    a, b = _Record(1, None), _Record(2, None)
    runs.add(a, b"ab", 2)
    runs.add(a, b"cd", 2)
    runs.add(_Record(3, _inbox(handle=3)), b"inbox", 5)  # between: no effect on a's run
    runs.add(a, b"ef", 2)
    runs.add(b, b"gh", 2)
    runs.flush()
    runs.flush()  # nothing pending: nothing more
    events = runs.take_events()
    assert events == [ev.DataReceived(1, b"ab", 6, (b"cd", b"ef")), ev.DataReceived(2, b"gh", 2)]
    assert runs.take_events() == []


def test_a_waiting_reader_is_woken_once_and_a_full_inbox_reported_behind_once() -> None:
    runs = DataRuns()
    inbox = _inbox()
    inbox.behind_at = 5
    inbox.waits()
    assert inbox.waiting
    runs.add(_Record(1, inbox), b"abc", 3)
    runs.add(_Record(1, inbox), b"defg", 4)  # past behind_at
    runs.add(_Record(1, inbox), b"h", 1)
    assert runs.woken == [inbox] and not inbox.waiting
    assert runs.behind == [inbox] and inbox.behind


def test_data_that_came_as_an_event_goes_into_the_inbox_the_same_way() -> None:
    runs = DataRuns()
    inbox = _inbox()
    inbox.behind_at = 3
    runs.put(inbox, b"a", (), 1)  # nobody waits, not behind yet
    assert runs.woken == [] and runs.behind == []
    inbox.waits()
    runs.put(inbox, memoryview(b"abcd"), (b"ef",), 6)
    assert [bytes(p) for p in inbox.parts] == [b"a", b"abcd", b"ef"]
    assert inbox.size == inbox.unconsumed == runs.received == 7
    assert runs.woken == [inbox] and runs.behind == [inbox]


# -- Inbox: reads, counts, reports --------------------------------------------------------------


def test_take_hands_out_parts_copied_at_most_once() -> None:
    inbox = _inbox()
    read = bytes(range(256)) * 4
    inbox.add(read, (), len(read))  # (add copies: counted elsewhere)
    inbox.unconsumed = len(read)
    big = memoryview(read)
    inbox.parts[0] = big  # a view, as DataRuns keeps one
    assert inbox.take(100) == read[:100]  # the front of a larger part
    assert isinstance(inbox.parts[0], memoryview)  # the rest stays a view
    assert inbox.take(1024) == read[100:]  # the rest, whole: one copy
    inbox.parts.extend([b"a", b"bc", b"def", b"ghij"])
    inbox.size = 10
    inbox.unconsumed += 10
    assert inbox.take(6) == b"abcdef"  # small parts joined up to n
    assert inbox.take(2) == b"gh"
    assert inbox.take(100) == b"ij"
    inbox.parts.extend([b"abc", b"defgh"])
    inbox.size = 8
    inbox.unconsumed += 8
    assert inbox.take(4) == b"abc"  # the next part does not fit: the first alone
    assert inbox.take(5) == b"defgh"  # exactly n
    assert inbox.size == 0 and inbox.unconsumed == 0 and inbox.pending == len(read) + 18


def test_consumption_is_reported_at_the_step_or_at_once_when_eager() -> None:
    calls = []
    plane = Plane()
    plane.on_report = lambda: calls.append(1)
    inbox = _inbox(plane)
    inbox.report_at = 10
    inbox.parts.extend([b"12345", b"67890", b"abc"])
    inbox.size = inbox.unconsumed = 13
    inbox.take(5)
    assert plane.reports == [] and inbox.pending == 5
    inbox.take(5)
    assert plane.reports == [inbox] and calls == [1] and inbox.reporting
    inbox.take(3)
    assert plane.reports == [inbox] and calls == [1]  # once in the list, one hook call
    assert plane.take() == [inbox] and not inbox.reporting and plane.reports == []
    inbox.pending = 0
    inbox.unconsumed = 3
    inbox.consume(1)  # bytes the reader held in its own buffer: below the step
    assert plane.reports == [] and inbox.pending == 1
    plane.eager = True
    inbox.consume(1)
    assert plane.reports == [inbox] and calls == [1, 1] and inbox.unconsumed == 1


def test_a_reader_that_waits_reports_where_the_step_is_an_estimate() -> None:
    plane = Plane()
    inbox = _inbox(plane)
    inbox.pending = 7
    inbox.waits()
    assert plane.reports == []  # a bound: nothing is due before it
    inbox.report_on_wait = True
    inbox.waits()
    assert plane.reports == [inbox]


def test_drop_and_take_all() -> None:
    inbox = _inbox()
    inbox.add(b"ab", (b"cd",), 4)
    inbox.unconsumed = 9
    assert inbox.take_all() == [b"ab", b"cd"] and inbox.size == 0 and not inbox.parts
    inbox.add(b"xy", (), 2)
    assert inbox.drop() == 9 and inbox.unconsumed == 0 and inbox.size == 0 and not inbox.parts
    assert "size=0" in repr(inbox)
    plane = Plane()  # no hook: reports wait for whoever takes them
    inbox2 = _inbox(plane)
    plane.report(inbox2)
    assert plane.reports == [inbox2]


# -- the engine's hooks ---------------------------------------------------------------------------


def test_an_attached_inbox_takes_the_engines_data_frames() -> None:
    config = SessionConfig()
    engine = make_engine("yamux", config, is_client=False)
    events = engine.receive_data(yamux.encode_header(yamux.Type.WINDOW_UPDATE, yamux.Flag.SYN, 1, 0))
    (opened,) = [e for e in events if isinstance(e, ev.ChannelOpened)]
    handle = opened.channel
    engine.accept_channel(handle)
    inbox = _inbox(handle=handle)
    assert engine.attach_inbox(handle, inbox)
    frame = yamux.encode_frame(yamux.Frame(yamux.Type.DATA, 0, 1, 5, b"hello"))
    assert engine.receive_data(frame + frame) == []
    assert [bytes(p) for p in inbox.parts] == [b"hello", b"hello"]
    assert engine.attach_inbox(handle, None)
    assert engine.receive_data(frame) == [ev.DataReceived(handle, memoryview(frame)[12:], 5)]
    assert not engine.attach_inbox(999, inbox)


def test_the_credit_step_of_each_kind_of_window() -> None:
    config = SessionConfig(receive_window=64 * 1024)
    yx = make_engine("yamux", config, is_client=True)
    handle = yx.open_channel()
    record = yx._channels[handle]
    assert record.recv is not None
    assert yx.credit_step(handle) == record.recv.threshold
    record.recv.outstanding = record.recv.pending = 1000
    assert yx.credit_step(handle) == record.recv.threshold - 1000
    assert yx.credit_step(999) == 1  # gone: report at once (credit is moot)
    mx = make_engine("mplex", config, is_client=True)
    assert mx.credit_step(mx.open_channel()) == NO_CREDIT_STEP
    om = make_engine("omnistreams", config, is_client=True)
    mine = om.open_channel()
    assert om.credit_step(mine) == NO_CREDIT_STEP  # ours to write: nothing to credit
    assert om.credit_step(999) == NO_CREDIT_STEP
    assert om.credit_estimated and not yx.credit_estimated
    theirs = make_engine("omnistreams", config, is_client=False)
    (opened,) = [
        e for e in theirs.receive_data(b"".join(om.data_to_send())) if isinstance(e, ev.ChannelOpened)
    ]
    theirs.accept_channel(opened.channel)
    assert theirs.credit_step(opened.channel) >= 1  # a stream we read: from its messages


def test_the_omnistreams_credit_step_follows_the_messages() -> None:
    """Bytes of the oldest messages that complete the batch; for those not here yet, the
    latest message's size each."""
    window = MessageWindow(8, 4)
    assert window.bytes_until_due() == 4  # nothing yet: four messages of at least a byte
    for size in (100, 100):
        assert window.received_message(size)
    assert window.bytes_until_due() == 200 + 2 * 100
    window.received_message(0)  # an empty message counts at once
    assert window.bytes_until_due() == 200 + 100
    for size in (50, 50, 50):
        window.received_message(size)
    assert window.bytes_until_due() == 250  # the batch is held: its bytes exactly
    assert window.consumed_bytes(60) == 0
    assert window.bytes_until_due() == 190


def test_an_mplex_frame_for_a_streamed_channel_never_becomes_an_event() -> None:
    engine = make_engine("mplex", SessionConfig(), is_client=False)
    (opened,) = engine.receive_data(mplex.encode_frame(mplex.Frame(1, mplex.Flag.NEW_STREAM, b"x")))
    assert isinstance(opened, ev.ChannelOpened)
    inbox = _inbox(handle=opened.channel)
    engine.attach_inbox(opened.channel, inbox)
    data = mplex.encode_frame(mplex.Frame(1, mplex.Flag.MESSAGE_INITIATOR, b"payload"))
    assert engine.receive_data(data * 3) == []
    assert inbox.size == 21 and engine.runs.received == 21
