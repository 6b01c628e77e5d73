"""One memory budget for many sessions (a server's ``max_memory``: ``MemoryAccount``), driven
with explicit times: each session's budget reports what it holds; past the limit the
sessions holding at least their share stop reading (``SHARED``), the others read on; they
read again at three quarters (of the sum, or of their share), found by a look every
``RECHECK`` seconds while held back; a session that ends stops counting."""

from __future__ import annotations

import pytest

from polymux.session import MemoryAccount, SessionCore, events as ce
from polymux.session.budget import RECHECK, SHARED

from .corekit import drain, open_to, pair


KIB = 1024


def feed(peer: SessionCore, core: SessionCore, n: int, now: float = 0.0) -> int:
    """The peer opens a channel and writes ``n`` bytes, which ``core`` receives and does
    not consume; returns ``core``'s handle."""
    mine, theirs = open_to(peer, core, "x", now)
    peer.write(mine, b"x" * n)
    core.receive_data(drain(peer), now)
    core.events()
    return theirs


def test_a_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_memory must be a positive int, got 0"):
        MemoryAccount(0)


def test_past_the_limit_the_heaviest_stop_reading_and_the_light_read_on() -> None:
    account = MemoryAccount(1000 * KIB)
    (pa, a), (pb, b) = pair("mplex"), pair("mplex")
    for c in (a, b):
        c.budget.join(account)
    assert account.members == 2 and account.share() == 500 * KIB
    feed(pa, a, 700 * KIB)
    assert a.reading  # alone over its share, but the sum is within the limit
    hb = feed(pb, b, 400 * KIB)
    assert account.held == 1100 * KIB
    assert b.reading  # under its share: read on
    assert a.reading  # not told yet: it finds out at its next read
    mine, _ = open_to(pa, a, "z")
    pa.write(mine, b"z")
    a.receive_data(drain(pa), 0.5)
    assert not a.reading and a.pressure.bits & SHARED and account.paused == 1
    assert account.pauses == 1
    # b reads more: it now holds more than its share too, and stops.
    mine, _ = open_to(pb, b, "y")
    pb.write(mine, b"y" * 200 * KIB)
    b.receive_data(drain(pb), 1.0)
    assert not b.reading and account.paused == 2
    # b's application reads: down to three quarters of the limit, b reads again, and a
    # finds out at its next look (every RECHECK seconds while held back).
    b.consumed(hb, 400 * KIB)
    assert b.reading
    assert account.held == 900 * KIB + 1  # not yet 3/4 of the limit: a stays held back
    assert a.next_deadline() == pytest.approx(0.5 + RECHECK)
    a.handle_timer(0.5 + RECHECK)
    assert not a.reading


def test_a_session_held_back_reads_again_at_three_quarters() -> None:
    account = MemoryAccount(1000 * KIB)
    (pa, a), (pb, b) = pair("mplex"), pair("mplex")
    a.budget.join(account)
    b.budget.join(account)
    hb = feed(pb, b, 200 * KIB)
    ha = feed(pa, a, 900 * KIB)
    assert not a.reading and b.reading
    b.consumed(hb, 200 * KIB)  # the sum: 900 KiB, over 3/4; a over 3/4 of its share
    a.handle_timer(RECHECK)
    assert not a.reading
    a.consumed(ha, 600 * KIB)  # its own: 300 KiB, under 3/4 of its share (500)
    assert a.reading and account.paused == 0


def test_a_session_that_ends_stops_counting() -> None:
    account = MemoryAccount(100 * KIB)
    pa, a = pair("mplex")
    a.budget.join(account)
    feed(pa, a, 300 * KIB)
    assert not a.reading and account.held == 300 * KIB
    a.budget.leave()
    assert account.held == 0 and account.members == 0 and account.paused == 0
    assert not a.pressure.bits & SHARED
    a.budget.leave()  # twice: nothing more
    a.pressure.recheck and a.pressure.recheck()  # a look after it left: nothing
    assert a.budget.account is None


def test_the_connection_lost_releases_what_it_held() -> None:
    account = MemoryAccount(1000 * KIB)
    pa, a = pair("mplex")
    a.budget.join(account)
    feed(pa, a, 300 * KIB)
    a.connection_lost(None)
    assert any(isinstance(e, ce.Finished) for e in a.events())
    assert account.held == 0
    a.budget.leave()  # (the server's part, when the connection is gone)
    assert account.members == 0 and account.paused == 0


def test_a_session_held_back_finds_out_that_others_freed_memory() -> None:
    account = MemoryAccount(1000 * KIB)
    (pa, a), (pb, b) = pair("mplex"), pair("mplex")
    a.budget.join(account)
    b.budget.join(account)
    hb = feed(pb, b, 400 * KIB)
    feed(pa, a, 700 * KIB)
    assert not a.reading
    b.consumed(hb, 400 * KIB)  # the sum: 700 KiB, under 3/4 of the limit
    assert not a.reading  # a does not know yet ...
    a.handle_timer(RECHECK)  # ... until its next look
    assert a.reading and account.paused == 0
    assert a.next_deadline() is None  # no more looks once it reads
