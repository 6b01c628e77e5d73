"""Properties of the session core under random interleavings (hypothesis): two cores joined
by a byte pipe cut at random points, with random opens, writes, consumption, ends, closes,
resets, write limits and time. After every step the core's accounting matches its channels
(unsent bytes, the memory budget's held bytes, held writers, reasons to pause reading); when
every channel has ended, everything is back to zero and every byte written before an end
arrived intact."""

from __future__ import annotations

from dataclasses import dataclass, field

import hypothesis
from hypothesis import HealthCheck, example, given, settings, strategies as st

from polymux import formats
from polymux.engine.streamux import StreamuxEngine
from polymux.session import SessionCore, events as ce

from .corekit import core


FORMATS = ("yamux", "mplex", "mstream-v3", "smux-v2", "mstream-v1", "streamux")
NO_RESET = ("smux-v2",)

OPTIONS = {
    "receive_window": 4096,
    "write_buffer_high": 2048,
    "max_session_memory": 48 * 1024,
    "batch_bytes": 4096,
    "send_frame": 1024,
    "close_timeout": 10.0,
}


@dataclass
class Side:
    core: SessionCore
    wire: bytearray = field(default_factory=bytearray)  # sent by this side, not yet delivered
    live: list[int] = field(default_factory=list)  # channels the application still holds
    no_write: set[int] = field(default_factory=set)  # ended, closed or stopped by the peer
    reset: set[int] = field(default_factory=set)  # reset by either side: bytes may be lost
    written: dict[int, bytearray] = field(default_factory=dict)
    got: dict[int, bytearray] = field(default_factory=dict)
    keys: dict[int, str] = field(default_factory=dict)  # handle -> the channel's name on both sides


def check_accounting(c: SessionCore) -> None:
    """The core's totals are the sums over its channels."""
    cap = c.budget.unsent_cap
    channels = c.channels.values()
    assert c.budget.unsent == sum(ch.buffered for ch in channels)
    unread = sum(ch.unconsumed for ch in channels)
    holding = sum(ch.buffered for ch in channels if ch.holding)
    unsent = sum(min(ch.buffered, cap) for ch in channels if not ch.holding)
    assert (c.budget.unread, c.budget.holding, c.budget.unsent_counted) == (unread, holding, unsent)
    # Unsent bytes count towards the budget only while the socket takes nothing; held
    # responses never (the format bounds them: only reading ends their requests).
    assert c.budget.held == unread + (unsent if c.pressure.write_paused else 0)
    if isinstance(c.engine, StreamuxEngine):
        assert c.engine.held_bytes <= c.engine.options.hold_budget
    for ch in c.budget.held_writers:
        assert c.channels.get(ch.handle) is ch and ch.held and ch.paused
    pausers = sum(ch.slow for ch in channels)
    if not c.engine.has_flow_control:
        pausers += sum(ch.reading_paused for ch in channels)
    assert c.pressure.pausers == pausers
    assert c.reading == (c.pressure.bits == 0)


def take_events(me: Side, peer: int) -> None:
    """What a driver does with the core's events (the application's view of its channels)."""
    for event in me.core.events():
        if isinstance(event, ce.Incoming):
            me.live.append(event.handle)
            me.keys[event.handle] = f"{peer}:{event.name}"
            me.written[event.handle] = bytearray()
            me.got[event.handle] = bytearray()
        elif isinstance(event, ce.Data):
            me.got[event.handle] += bytes(event.data) + b"".join(bytes(m) for m in event.more)
        elif isinstance(event, ce.Finished):
            if not event.lingering:
                me.live.remove(event.handle)
            if event.error is not None or event.drop_unread:
                me.reset.add(event.handle)
            me.no_write.add(event.handle)
        elif isinstance(event, ce.WritingStopped):
            me.no_write.add(event.handle)


KINDS = (
    # Repeated kinds are drawn more often: the wire and the writers do most of the work.
    "write", "write", "write", "consume", "consume", "send", "send", "deliver", "deliver",
    "open", "eof", "close", "reset", "limits", "tick",
)  # fmt: skip
TICKS = (0.5, 3.0, 11.0)  # 11 s passes close_timeout: lingering channels are reset

Step = tuple[str, int, int, int]
"""(kind, side, channel index, amount): bytes to write, consume or deliver, a write
buffer's high mark, or (tick) an index into TICKS."""

steps_strategy = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.integers(0, 1),
        st.integers(0, 7),
        st.one_of(st.sampled_from([1000, 2049, 4096, 9000, 30_000]), st.integers(1, 6000)),
    ),
    min_size=15,
    max_size=80,
)


# Found by CI: a writer the session's unsent budget held resumed by its own low-water mark
# and stayed among the held writers (Budget.update_pause left ``held`` set).
HELD_THEN_RESUMED: list[Step] = [
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 1, 5, 2049),
    ("send", 1, 0, 1000),
    ("send", 0, 0, 1000),
    ("reset", 0, 7, 1000),
    ("open", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("deliver", 1, 0, 1000),
    ("deliver", 0, 0, 1000),
    ("reset", 1, 4, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 1, 1, 30000),
    ("write", 1, 2, 2049),
    ("send", 0, 0, 1000),
    ("open", 1, 0, 1000),
    ("reset", 0, 4, 1000),
    ("limits", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("deliver", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("send", 1, 0, 1000),
    ("deliver", 0, 1, 1000),
    ("reset", 1, 0, 1000),
    ("reset", 1, 3, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 0, 0, 1000),
    ("write", 1, 1, 4096),
    ("write", 1, 4, 30000),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(fmt="mstream-v3", slow_reader="block", opens=(3, 3), steps=HELD_THEN_RESUMED)
@given(
    fmt=st.sampled_from(FORMATS),
    slow_reader=st.sampled_from(["block", "reset"]),
    opens=st.tuples(st.integers(1, 3), st.integers(0, 3)),
    steps=steps_strategy,
)
def test_random_interleavings_keep_the_accounting_and_end_at_zero(
    fmt: str, slow_reader: str, opens: tuple[int, int], steps: list[Step]
) -> None:
    """Whatever the application and the wire do, in any order: the accounting invariants hold
    after every step; once every channel has ended, unsent and held bytes are 0, no writer
    is held, reading is not paused, and channels nobody reset delivered every byte."""
    options = {**OPTIONS, "slow_reader": slow_reader, "slow_reader_timeout": 0}
    if fmt == "yamux":  # its windows are its own: a receive_window below 256 KiB is refused
        del options["receive_window"]
    sides = [Side(core(fmt, client=True, **options)), Side(core(fmt, client=False, **options))]
    names = formats.get(fmt).caps.names
    # smux has no reset: a reset is a FIN after which the stream is forgotten, so the peer
    # cannot tell it from a half-close, and its writer waiting for credit (version 2) waits
    # for ever (xtaci's writer gives up on a FIN instead). Not the core's to solve: on smux
    # the application here ends its channels instead of resetting or closing them.
    no_reset = fmt in NO_RESET
    now = 0.0

    def settle() -> None:
        for i, me in enumerate(sides):
            take_events(me, 1 - i)
            check_accounting(me.core)

    def send(i: int) -> None:
        me = sides[i]
        while out := me.core.data_to_send():
            me.wire += b"".join(bytes(p) for p in out)

    def deliver(i: int, n: int) -> None:
        """Up to ``n`` bytes of what side ``i`` sent reach the other side (cut anywhere, a
        frame too), if that side reads now."""
        src, dst = sides[i], sides[1 - i]
        if not dst.core.reading or not src.wire:
            return
        chunk = bytes(src.wire[:n])
        del src.wire[:n]
        dst.core.receive_data(chunk, now)

    for i in (0, 1):  # handshakes
        send(i)
        deliver(i, 1 << 30)
    settle()
    prelude: list[Step] = [("open", i, 0, 0) for i, n in enumerate(opens) for _ in range(n)]
    for kind, i, index, amount in prelude + steps:
        me = sides[i]
        c = me.core
        if kind == "open":
            # A name the peer sees: ours where the format carries names, else the wire id.
            handle = c.open_channel(f"{i}-{len(me.keys)}" if names else "")
            me.keys[handle] = f"{i}:{c.engine.channel_name(handle)}"
            me.live.append(handle)
            me.written[handle] = bytearray()
            me.got[handle] = bytearray()
        elif kind == "send":
            send(i)
        elif kind == "deliver":
            deliver(i, amount)
        elif kind == "tick":
            now += TICKS[amount % len(TICKS)]
            for side in sides:
                side.core.handle_timer(now)
        elif me.live:
            pick = me.live[index % len(me.live)]
            if no_reset and kind in ("close", "reset"):
                kind = "eof"
            if kind == "write":
                if pick in me.no_write or c.channels[pick].eof_requested:
                    continue
                data = bytes([pick % 251]) * amount
                c.write(pick, data)
                if pick in c.channels:
                    me.written[pick] += data
            elif kind == "consume":
                c.consumed(pick, min(amount, c.channels[pick].unconsumed if pick in c.channels else 0), now)
            elif kind == "eof":
                c.write_eof(pick)
                me.no_write.add(pick)
            elif kind == "close":
                c.close_channel(pick)
                me.no_write.add(pick)
                me.reset.add(pick)  # what still arrives is dropped
            elif kind == "reset":
                c.reset(pick)
                me.reset.add(pick)
            else:  # limits
                c.set_write_limits(pick, amount, amount // 4)
        settle()

    # The end: both applications read everything and end every channel; the wire runs.
    for _ in range(500):
        for side in sides:
            c = side.core
            for handle, channel in list(c.channels.items()):
                if channel.unconsumed:
                    c.consumed(handle, channel.unconsumed, now)
                if not channel.eof_requested and not channel.closing:
                    c.write_eof(handle)
                    side.no_write.add(handle)
        settle()
        send(0)
        send(1)
        moved = bool(sides[0].wire or sides[1].wire)
        deliver(0, 1 << 30)
        deliver(1, 1 << 30)
        settle()
        if not moved and not any(s.core.channels for s in sides):
            break
        if not moved:
            now += 11.0  # close_timeout: lingering channels whose peer is gone
            for side in sides:
                side.core.handle_timer(now)
            settle()
    for side in sides:
        c = side.core
        assert not c.channels, f"channels left: {c.channels}"
        assert c.budget.unsent == 0 and c.budget.held == 0
        assert not c.budget.held_writers and c.pressure.pausers == 0 and c.reading
        assert not c.failed, c.error
    # Channels nobody reset (and nobody closed early) delivered every byte, in order.
    by_key = [{key: handle for handle, key in side.keys.items()} for side in sides]
    checked = 0
    for key, mine in by_key[0].items():
        theirs = by_key[1].get(key)
        if theirs is None:
            continue  # reset before the peer saw it
        for src, dst, s_h, d_h in ((sides[0], sides[1], mine, theirs), (sides[1], sides[0], theirs, mine)):
            if s_h in src.reset or d_h in dst.reset:
                continue
            assert bytes(dst.got[d_h]) == bytes(src.written[s_h])
            checked += 1
    # Seen with --hypothesis-show-statistics: how much each example did.
    hypothesis.event(f"directions checked: {min(checked, 4)}")
    hypothesis.event(
        f"KiB written: {min(sum(len(w) for side in sides for w in side.written.values()) // 4096 * 4, 40)}"
    )
    hypothesis.event(f"channels reset or closed: {min(len(sides[0].reset) + len(sides[1].reset), 3)}")
