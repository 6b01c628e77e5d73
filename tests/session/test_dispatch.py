"""The one event dispatch of both drivers (session/dispatch.py), with a recording driver:
every event reaches the hook it names or settles the waiter it concerns
(session/waiters.py), a channel's events reach its channel object (and what nobody holds is
credited back), a finished channel leaves the driver's table; and the input-slicing policy
(session/slicing.py)."""

from __future__ import annotations

from typing import Any

from polymux._types import BytesLike
from polymux.exceptions import ChannelRejected, LimitExceeded, SessionClosed
from polymux.formats import make_engine
from polymux.session import SessionCore, events as ce
from polymux.session.dispatch import Dispatcher
from polymux.session.slicing import FULL_READ, SLICE, SLICE_FRAMES, SLICED_FOR, InputSlicer, dense
from polymux.session.waiters import Waiter, Waiters
from polymux.wire import mplex

from .corekit import open_to, pair, pump


class Chan:
    def __init__(self, log: list[tuple[Any, ...]], handle: int) -> None:
        self.log = log
        self.handle = handle

    def data(self, data: BytesLike, more: tuple[BytesLike, ...], n: int) -> None:
        self.log.append(("data", self.handle, bytes(data) + b"".join(bytes(m) for m in more), n))

    def remote_end(self) -> None:
        self.log.append(("remote_end", self.handle))

    def finished(
        self,
        error: Exception | None,
        write_error: Exception | None,
        *,
        drop_unread: bool = False,
        lingering: bool = False,
    ) -> None:
        self.log.append(("finished", self.handle, error, write_error, drop_unread, lingering))

    def resume_writing_now(self) -> None:
        self.log.append(("resume", self.handle))

    def writing_stopped(self, error: Exception) -> None:
        self.log.append(("writing_stopped", self.handle, error))


class Flag:
    """A driver's signal (session/waiters.py): counts its wake-ups."""

    def __init__(self) -> None:
        self.woken = 0

    def set(self) -> None:
        self.woken += 1


class Recorder:
    """A driver that records every hook call."""

    def __init__(self, core: SessionCore) -> None:
        self.core = core
        self.log: list[tuple[Any, ...]] = []
        self.channels: dict[int, Chan] = {}
        self.waiters: Waiters[Flag, str, str] = Waiters(core, Flag)
        self.dispatcher = Dispatcher(core, self, self.channels, self.waiters)
        self.reentered: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("on_"):
            raise AttributeError(name)

        def hook(*args: Any) -> Any:
            self.log.append((name, *args))
            if name == "on_incoming":
                self.channels[args[0]] = Chan(self.log, args[0])
            if name == "on_ready":
                self.reentered.append(self.dispatcher.run())
            return f"pair {args[0]}" if name == "on_pair_answered" else None

        return hook


def run(
    core: SessionCore,
    *events: ce.CoreEvent,
    channels: tuple[int, ...] = (),
    opening: tuple[int, ...] = (),
    rec: Recorder | None = None,
) -> list[tuple[Any, ...]]:
    rec = rec or Recorder(core)
    for handle in channels:
        rec.channels[handle] = Chan(rec.log, handle)
    for handle in opening:
        rec.waiters.opens.wait(handle)
    for event in events:
        core.emit(event)
    assert rec.dispatcher.run() is True
    return rec.log


def outcome(waiter: Waiter[Flag, Any]) -> Any:
    """What the waiter's task gets: its value, or the error it raises."""
    assert waiter.signal.woken == 1
    try:
        return waiter.result()
    except Exception as exc:  # noqa: BLE001 - the outcome under test
        return exc


def test_every_session_event_reaches_its_hook() -> None:
    a, _b = pair("yamux")
    error = LimitExceeded("x")
    assert run(
        a,
        ce.Incoming(1, "in"),
        ce.IncomingPair(5, 6, "pair"),
        ce.PairAnswered(9, 10, None),
        ce.PairFailed("p", error),
        ce.Ready(),
        ce.Failed(error),
    ) == [
        ("on_incoming", 1, "in"),
        ("on_incoming_pair", 5, 6, "pair"),
        ("on_pair_answered", 9, 10),
        ("on_pair_failed", "p", error),
        ("on_ready",),
        ("on_failed", error),
    ]


def test_what_tasks_wait_for_is_settled_by_its_event() -> None:
    """Pings, requests, stream pairs, control messages and room to open: the event settles
    the session's waiter of its key (and no other), the way both drivers see it."""
    a, _b = pair("yamux", max_unacked_opens=1)
    a.open_channel()  # unacknowledged: no room to open
    rec = Recorder(a)
    waiters = rec.waiters
    ping, other_ping = waiters.pings.wait(7), waiters.pings.wait(8)
    answered, refused = waiters.requests.wait(3), waiters.requests.wait(4)
    paired, unpaired = waiters.pairs.wait(9), waiters.pairs.wait(11)
    room = waiters.room._join(front=False)
    control = waiters.control._join(front=False)
    error = LimitExceeded("x")
    rejected = ChannelRejected("yamux", "channel 4", "no")
    log = run(
        a,
        ce.PingAnswered(7, 0.5),
        ce.Answered(3, [b"ans", b"wer"], None),
        ce.Answered(4, None, rejected),
        ce.PairAnswered(9, 10, None),
        ce.PairAnswered(11, None, error),
        ce.RoomToOpen(error),
        rec=rec,
    )
    assert log == [("on_pair_answered", 9, 10)]
    assert outcome(ping) == 0.5 and other_ping.signal.woken == 0
    assert outcome(answered) == [b"ans", b"wer"] and outcome(refused) is rejected
    assert outcome(paired) == "pair 9" and paired.handle == 10 and outcome(unpaired) is error
    assert outcome(room) is error
    assert control.signal.woken == 0
    a.controls.arrived(b"hello")
    run(a, ce.ControlArrived(), rec=rec)
    assert control.signal.woken == 1
    # Room for the opens that wait, when there is room (everyone: all of them, to find
    # that there is none any more).
    opens = [waiters.room._join(front=False) for _ in range(3)]
    run(a, ce.RoomToOpen(everyone=True), rec=rec)
    assert [w.signal.woken for w in opens] == [1, 1, 1]


def test_a_pair_answer_nobody_waits_for_is_reset() -> None:
    """The peer's half of a pair given up meanwhile: made (its data may follow), then reset."""
    a, b = pair("mplex")
    _x, y = open_to(a, b)
    rec = Recorder(b)
    rec.channels[y] = Chan(rec.log, y)
    log = run(b, ce.PairAnswered(99, y, None), rec=rec)
    assert log[0] == ("on_pair_answered", 99, y)
    assert y not in b.channels and log[1][:2] == ("finished", y)


def test_a_hook_that_calls_back_in_takes_nothing() -> None:
    """A hook that re-enters the dispatch gets False; the outer run goes on with the
    events queued meanwhile."""
    a, _b = pair("yamux")
    rec = Recorder(a)
    a.emit(ce.Ready())
    assert rec.dispatcher.run() is True
    assert rec.reentered == [False] and not rec.dispatcher.busy


def test_channel_events_reach_the_channel_and_opens_settle_only_when_awaited() -> None:
    a, _b = pair("yamux")
    stopped = ConnectionError("stop")
    rejected = ChannelRejected("yamux", "channel 3", "x")
    log = run(
        a,
        ce.Data(1, b"ab", (memoryview(b"cd"),), 4),
        ce.Ended(1),
        ce.WriteResumed(1),
        ce.WritingStopped(1, stopped),
        ce.Accepted(2),
        ce.Accepted(4),  # nobody waits for it
        ce.OpenFailed(3, rejected),
        ce.OpenFailed(4, rejected),  # nobody waits for it
        ce.Finished(1, lingering=True),
        ce.Finished(1),
        ce.Finished(3),
        ce.Finished(8),  # no channel, no open
        channels=(1,),
        opening=(2, 3),
    )
    assert log == [
        ("data", 1, b"abcd", 4),
        ("remote_end", 1),
        ("resume", 1),
        ("writing_stopped", 1, stopped),
        ("finished", 1, None, None, False, True),
        ("finished", 1, None, None, False, False),
    ]


def test_opens_settle_by_acceptance_refusal_or_the_channels_end() -> None:
    a, _b = pair("yamux")
    rec = Recorder(a)
    accepted, refused, ended = (rec.waiters.opens.wait(h) for h in (2, 3, 5))
    rejected = ChannelRejected("yamux", "channel 3", "x")
    run(a, ce.Accepted(2), ce.OpenFailed(3, rejected), ce.Finished(3), ce.Finished(5), rec=rec)
    assert outcome(accepted) is None and outcome(refused) is rejected
    error = outcome(ended)
    assert isinstance(error, SessionClosed) and str(error) == "yamux: the channel ended"
    assert not rec.waiters.opens.waiting


def test_events_of_channels_the_driver_does_not_hold_change_nothing_but_credit() -> None:
    """Data for a channel the driver no longer holds is consumed at once (the peer's
    credit keeps flowing); its other events are dropped."""
    a, b = pair("yamux", receive_window=256 * 1024)
    x, y = open_to(a, b)
    b.write(y, bytes(200_000))
    pump(a, b)
    assert a.channels[x].unconsumed == 200_000
    data = [e for e in a.events() if isinstance(e, ce.Data)]
    log = run(a, *data, ce.Ended(x), ce.WriteResumed(x), ce.WritingStopped(x, ConnectionError()))
    assert log == []
    assert a.channels[x].unconsumed == 0  # credited back


def test_input_slices() -> None:
    slicer = InputSlicer()
    assert slicer.next_slice() is None
    data = bytes(range(256)) * (2 * SLICE // 256 + 1)
    slicer.hold(data)
    got = []
    while (piece := slicer.next_slice()) is not None:
        assert len(piece) <= SLICE
        got.append(piece)
    assert b"".join(got) == data and len(got) == 3 and slicer.pending is None


def test_slices_end_where_frames_end() -> None:
    """A slice reaches to the end of its first SLICE_FRAMES frames when they pass SLICE
    bytes: a read of 64 KiB frames is one slice (the read itself, not a copy), a read of
    tiny frames goes in SLICE bytes, and a read that starts inside a frame completes it."""
    engine = make_engine("mplex")
    big = mplex.encode_frame(mplex.Frame(1, mplex.Flag.MESSAGE_INITIATOR, bytes(64 * 1024)))
    read = (big * 5)[:FULL_READ]  # four whole frames and the start of a fifth
    slicer = InputSlicer(engine.whole_frames)
    slicer.hold(read)
    assert slicer.next_slice() is read and slicer.pending is None
    tiny = mplex.encode_frame(mplex.Frame(1, mplex.Flag.MESSAGE_INITIATOR, b"x"))
    read = tiny * (FULL_READ // len(tiny))
    slicer.hold(read)
    sizes = []
    while (piece := slicer.next_slice()) is not None:
        sizes.append(len(piece))
    assert sizes == [SLICE] * (len(read) // SLICE) + ([len(read) % SLICE] if len(read) % SLICE else [])
    # Medium frames: SLICE_FRAMES of them a slice.
    medium = mplex.encode_frame(mplex.Frame(1, mplex.Flag.MESSAGE_INITIATOR, bytes(6000)))
    slicer.hold(medium * 40)
    assert len(slicer.next_slice() or b"") == SLICE_FRAMES * len(medium)
    slicer.pending = None
    # A read that starts inside a frame: its rest first (the engine holds its start).
    engine.receive_data(big[:100])
    rest = big[100:] + tiny * 20_000
    slicer.hold(rest)
    first = slicer.next_slice()
    assert first is not None and len(first) == len(big) - 100 + (SLICE_FRAMES - 1) * len(tiny)


def test_the_slicing_policy_both_drivers_apply() -> None:
    """A read goes in slices while sliced mode is on and it is larger than a slice, never
    for whole messages; dense work starts sliced mode for SLICED_FOR from its start."""
    slicer = InputSlicer()
    big = bytes(2 * SLICE)
    assert not slicer.holds(big, 0.0)  # sliced mode is off
    slicer.worked(10.0, 0.001, 12)  # cheap
    assert slicer.until == 0.0
    slicer.worked(10.0, 0.0, 0)  # nothing
    assert slicer.until == 0.0
    slicer.worked(10.0, 0.006, FULL_READ)  # dense
    assert slicer.until == 10.0 + SLICED_FOR
    assert not slicer.holds(bytes(SLICE), 10.5)  # a slice or less is read whole
    assert not slicer.holds(big, 10.0 + SLICED_FOR)  # lapsed
    assert slicer.holds(big, 10.5) and slicer.pending is not None
    messages = InputSlicer(never=True)
    messages.worked(10.0, 0.006, FULL_READ)
    assert not messages.holds(big, 10.5)


def test_only_dense_input_is_sliced() -> None:
    """Sliced mode starts (or goes on) only when input costs enough per byte that a full
    256 KiB read would take over TURN (5 ms): a flood of tiny frames, not a busy session of
    large frames whose turns of slices also run to TURN."""
    assert dense(0.006, FULL_READ)  # a full read of tiny frames: 6 ms
    assert dense(0.002, 64 * 1024)  # 8 ms a full read at that rate
    assert not dense(0.004, FULL_READ)
    assert not dense(0.004, 2 * FULL_READ)  # a turn of slices at 8 ns a byte
    assert not dense(0.0001, 12)  # a small read's fixed cost is not density
    assert dense(0.006, 12)
