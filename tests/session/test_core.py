"""The sans-I/O session core, driven with bytes, times and application calls: no sockets,
no event loop (two cores joined by a loop in the test, h11's ConnectionPair shape)."""

from __future__ import annotations

from polymux.config import SessionConfig
from polymux.formats import make_engine
from polymux.session import SessionCore, events as ce


def pair(fmt: str, **options: object) -> tuple[SessionCore, SessionCore]:
    config = SessionConfig(**options)  # type: ignore[arg-type]
    a = SessionCore(make_engine(fmt, config, is_client=True), config, 0.0)
    b = SessionCore(make_engine(fmt, config, is_client=False), config, 0.0, has_handler=True)
    a.connection_made(0.0)
    b.connection_made(0.0)
    pump(a, b)
    return a, b


def pump(a: SessionCore, b: SessionCore, now: float = 0.0, rounds: int = 50) -> None:
    """Move bytes both ways until neither has more to send."""
    for _ in range(rounds):
        moved = False
        for src, dst in ((a, b), (b, a)):
            while out := src.data_to_send():
                dst.receive_data(b"".join(bytes(p) for p in out), now)
                moved = True
        if not moved:
            return
    raise AssertionError("the cores kept talking")


def test_a_finished_channel_left_in_the_ready_queue_does_not_spin_the_scheduler() -> None:
    """Regression: a channel closed by us (its end queued) that the peer then ends and the
    core forgets stays in the ready queue; the scheduler must skip it and send the others
    (it used to loop on it forever, freezing the event loop)."""
    a, b = pair("omnistreams")
    out = a.open_channel("out")
    pump(a, b)
    (incoming,) = [e.handle for e in b.events() if isinstance(e, ce.Incoming)]
    a.events()
    b.write(incoming, b"x")  # the acceptor's side of a one-way stream cannot write ...
    b.close_channel(incoming)  # ... but closing it queues its end
    a.write_eof(out)
    a.close_channel(out)
    pump(a, b)  # would never return with the spinning scheduler
    assert not a.channels and not b.channels
