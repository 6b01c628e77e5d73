"""Tests of the window/credit arithmetic (:mod:`polymux.engine.flow`)."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from polymux.engine.flow import (
    UNLIMITED,
    MessageCredit,
    ReceiveWindow,
    SendCredit,
    default_ack_threshold,
    split_count,
)


# -- default_ack_threshold -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "minimum", "expected"),
    [
        (102_400, 20_480, 20_480),  # JS / old C# default window: window/8 = 12,800 < minimum
        (1_024_000, 20_480, 128_000),  # current C# default window: window/8 wins
        (163_840, 20_480, 20_480),  # window/8 == minimum
        (1_000, 20_480, 1_000),  # capped at the window, so a small window cannot deadlock
        (1, 20_480, 1),
        (16, 1, 2),
        (7, 1, 1),
        (8, 0, 1),
    ],
)
def test_default_ack_threshold(window: int, minimum: int, expected: int) -> None:
    assert default_ack_threshold(window, minimum) == expected


@given(st.integers(1, 2**40), st.integers(1, 2**40))
def test_default_ack_threshold_is_a_valid_receive_threshold(window: int, minimum: int) -> None:
    threshold = default_ack_threshold(window, minimum)
    assert 0 < threshold <= window
    ReceiveWindow(window, threshold)  # accepted


# -- SendCredit ----------------------------------------------------------------------------


def test_send_credit_consume_and_release() -> None:
    credit = SendCredit(100)
    assert (credit.window, credit.in_flight, credit.available) == (100, 0, 100)
    credit.consume(60)
    assert (credit.in_flight, credit.available) == (60, 40)
    credit.consume(40)
    assert credit.available == 0
    assert credit.release(30) is True
    assert (credit.in_flight, credit.available) == (70, 30)
    assert credit.release(0) is True
    assert credit.release(70) is True
    assert (credit.in_flight, credit.available) == (0, 100)


def test_send_credit_consume_past_window_is_a_local_bug() -> None:
    credit = SendCredit(100)
    credit.consume(60)
    with pytest.raises(ValueError, match="41 units exceeds the available credit of 40"):
        credit.consume(41)
    assert credit.in_flight == 60  # unchanged


def test_send_credit_zero_window() -> None:
    # An offer not yet accepted: nothing may be sent until the peer advertises a window.
    credit = SendCredit(0)
    assert credit.available == 0
    credit.consume(0)
    with pytest.raises(ValueError):
        credit.consume(1)


def test_send_credit_release_more_than_in_flight() -> None:
    credit = SendCredit(100)
    credit.consume(50)
    assert credit.release(51) is False
    assert credit.in_flight == 50  # a refused release changes nothing
    assert credit.release(-1) is False
    assert credit.in_flight == 50
    assert credit.release(50) is True
    assert credit.release(1) is False


def test_send_credit_unlimited() -> None:
    credit = SendCredit(None)
    assert credit.available == UNLIMITED
    credit.consume(10**12)
    assert credit.available == UNLIMITED  # in-flight bytes do not reduce unlimited credit
    assert credit.in_flight == 10**12
    assert credit.release(10**12) is True
    assert credit.release(1) is False
    credit.grow(5)
    assert credit.window is None
    assert credit.set_window(1_000) is False
    assert credit.window is None
    assert credit.available == UNLIMITED


def test_send_credit_set_window_only_grows() -> None:
    credit = SendCredit(100)
    credit.consume(80)
    assert credit.set_window(100) is False  # same value: the reference's refusal
    assert credit.set_window(50) is False  # stale/smaller: ignored
    assert credit.window == 100
    assert credit.available == 20
    assert credit.set_window(400) is True
    assert (credit.window, credit.available) == (400, 320)
    assert credit.set_window(399) is False
    assert credit.window == 400


def test_send_credit_grow_is_an_increment() -> None:
    credit = SendCredit(100)
    credit.consume(100)
    credit.grow(50)
    assert (credit.window, credit.available) == (150, 50)
    credit.grow(0)
    assert credit.window == 150


def test_send_credit_left_goes_negative_on_an_overrun() -> None:
    # (a trace of someone else's traffic sees a sender overrun the window; available stays 0)
    credit = SendCredit(10)
    credit.consume(4)
    assert credit.left == credit.available == 6
    credit.in_flight += 8
    assert (credit.left, credit.available) == (-2, 0)
    unlimited = SendCredit(None)
    unlimited.consume(5)
    assert (unlimited.left, unlimited.available) == (-5, UNLIMITED)


# -- ReceiveWindow -------------------------------------------------------------------------


@pytest.mark.parametrize(("window", "threshold"), [(0, 1), (-5, 1), (10, 0), (10, 11), (10, -1)])
def test_receive_window_rejects_bad_parameters(window: int, threshold: int) -> None:
    with pytest.raises(ValueError):
        ReceiveWindow(window, threshold)


def test_receive_window_overrun_detection() -> None:
    rw = ReceiveWindow(100, 25)
    assert rw.received(60) is True
    assert rw.received(40) is True  # exactly the window: allowed
    assert rw.outstanding == 100
    assert rw.received(1) is False  # one byte more: overrun
    assert rw.outstanding == 100  # a refused arrival is not counted
    assert rw.received(0) is True


def test_receive_window_overrun_in_one_frame() -> None:
    rw = ReceiveWindow(100, 25)
    assert rw.received(101) is False
    assert rw.outstanding == 0


def test_receive_window_batches_acks() -> None:
    rw = ReceiveWindow(100, 25)
    assert rw.received(100)
    assert rw.consumed(10) == 0
    assert rw.consumed(10) == 0
    assert (rw.pending, rw.outstanding) == (20, 100)
    assert rw.consumed(5) == 25  # reaches the threshold: everything pending goes back
    assert (rw.pending, rw.outstanding) == (0, 75)
    assert rw.consumed(40) == 40  # one consumption above the threshold: sent at once, whole
    assert (rw.pending, rw.outstanding) == (0, 35)
    # Credit returned frees the window for more arrivals.
    assert rw.received(65)
    assert rw.received(1) is False


def test_receive_window_flush() -> None:
    rw = ReceiveWindow(100, 50)
    assert rw.received(30)
    assert rw.consumed(10) == 0
    assert rw.flush() == 10
    assert (rw.pending, rw.outstanding) == (0, 20)
    assert rw.flush() == 0  # nothing pending: nothing to send
    assert rw.outstanding == 20


def test_receive_window_consumed_ignores_non_positive() -> None:
    rw = ReceiveWindow(100, 10)
    assert rw.received(50)
    assert rw.consumed(0) == 0
    assert rw.consumed(-5) == 0
    assert (rw.pending, rw.outstanding) == (0, 50)


def test_receive_window_consumed_is_capped_by_outstanding() -> None:
    # Credit can never be returned for bytes that have not arrived.
    rw = ReceiveWindow(100, 50)
    assert rw.received(10)
    assert rw.consumed(30) == 0
    assert rw.pending == 10
    assert rw.flush() == 10
    assert rw.outstanding == 0


def test_receive_window_grow() -> None:
    rw = ReceiveWindow(10, 5)
    rw.grow(6)
    assert (rw.window, rw.threshold) == (16, 5)  # no new threshold: the old one stays
    rw.grow(4, threshold=100)
    assert (rw.window, rw.threshold) == (20, 20)  # a threshold is capped at the window
    rw.grow(0, threshold=0)
    assert rw.threshold == 1
    with pytest.raises(ValueError, match="a window only grows, got -1"):
        rw.grow(-1)
    assert rw.window == 20


@pytest.mark.parametrize("chunk", [0, -1])
def test_message_credit_needs_a_positive_chunk(chunk: int) -> None:
    with pytest.raises(ValueError, match=f"chunk size must be positive, got {chunk}"):
        MessageCredit(chunk)


def test_split_count_refuses_negative_counts() -> None:
    assert split_count(10, most=4) == [4, 4, 2]
    with pytest.raises(ValueError, match="count must be >= 0, got -1"):
        split_count(-1)


def test_receive_window_threshold_equal_to_window() -> None:
    rw = ReceiveWindow(8, 8)
    assert rw.received(8)
    assert rw.consumed(7) == 0
    assert rw.consumed(1) == 8
    assert rw.outstanding == 0


# -- sender and receiver joined by the credit arithmetic -----------------------------------


class CreditLink(RuleBasedStateMachine):
    """One direction of a channel: a SendCredit and a ReceiveWindow, joined by an ordered
    data path (sender -> receiver) and an ordered credit path (receiver -> sender), with
    random interleavings of every step.

    The sender never sends more than ``available``, and the application never consumes
    more than it has received. Window adjusts (absolute, grow-only) travel on their own
    path and may arrive in any order, so stale ones are exercised too.
    """

    @initialize(window=st.integers(1, 300), minimum=st.integers(1, 400))
    def setup(self, window: int, minimum: int) -> None:
        self.threshold = default_ack_threshold(window, minimum)
        self.send = SendCredit(window)
        self.recv = ReceiveWindow(window, self.threshold)
        self.data_in_transit: deque[int] = deque()
        self.acks_in_transit: deque[int] = deque()
        self.adjusts_in_transit: list[int] = []
        self.unconsumed = 0  # received by the receiver, not yet consumed by its application
        self.consumed_total = 0
        self.credited_total = 0  # credit the receiver has returned (sent acks)
        self.received_total = 0

    # The sender.

    @precondition(lambda self: self.send.available > 0)
    @rule(data=st.data())
    def send_data(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(1, self.send.available), label="send")
        self.send.consume(n)
        self.data_in_transit.append(n)

    @precondition(lambda self: self.acks_in_transit)
    @rule()
    def deliver_ack(self) -> None:
        assert self.send.release(self.acks_in_transit.popleft()) is True

    @precondition(lambda self: self.adjusts_in_transit)
    @rule(data=st.data())
    def deliver_window_adjust(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.adjusts_in_transit) - 1), label="adjust")
        window = self.adjusts_in_transit.pop(index)
        before = self.send.window
        assert before is not None
        assert self.send.set_window(window) is (window > before)
        assert self.send.window == max(before, window)

    # The receiver.

    @precondition(lambda self: self.data_in_transit)
    @rule()
    def deliver_data(self) -> None:
        n = self.data_in_transit.popleft()
        assert self.recv.received(n) is True, "a sender that respected `available` overran"
        self.unconsumed += n
        self.received_total += n

    @precondition(lambda self: self.unconsumed > 0)
    @rule(data=st.data())
    def consume(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(1, self.unconsumed), label="consume")
        self.unconsumed -= n
        self.consumed_total += n
        credit = self.recv.consumed(n)
        assert credit == 0 or credit >= self.threshold  # batched
        self._ack(credit)

    @rule()
    def flush(self) -> None:
        self._ack(self.recv.flush())

    @rule(factor=st.integers(2, 4))
    def grow_window(self, factor: int) -> None:
        # ReceiveWindow has no growth method; an engine answering a growth request assigns
        # the larger window first and then tells the peer (ChannelWindowAdjust).
        self.recv.window *= factor
        self.adjusts_in_transit.append(self.recv.window)

    def _ack(self, credit: int) -> None:
        assert credit >= 0
        if credit:
            self.credited_total += credit
            self.acks_in_transit.append(credit)

    # Invariants.

    @invariant()
    def receiver_within_window(self) -> None:
        assert 0 <= self.recv.outstanding <= self.recv.window

    @invariant()
    def sender_within_window(self) -> None:
        window = self.send.window
        assert window is not None
        assert 0 <= self.send.in_flight <= window <= self.recv.window
        assert self.send.available == window - self.send.in_flight

    @invariant()
    def accounting_is_exact(self) -> None:
        assert self.recv.outstanding == self.received_total - self.credited_total
        assert self.recv.pending == self.consumed_total - self.credited_total
        assert 0 <= self.recv.pending < self.threshold
        # Every unit in flight is somewhere: on the wire, at the receiver, or on its way back.
        assert self.send.in_flight == (
            sum(self.data_in_transit) + self.recv.outstanding + sum(self.acks_in_transit)
        )

    @rule()
    def drain(self) -> None:
        """Deliver everything, consume everything, deliver every ack (no flush)."""
        while self.data_in_transit:
            self.deliver_data()
        if self.unconsumed:
            n, self.unconsumed = self.unconsumed, 0
            self.consumed_total += n
            self._ack(self.recv.consumed(n))
        while self.acks_in_transit:
            self.deliver_ack()
        while self.adjusts_in_transit:
            self.send.set_window(self.adjusts_in_transit.pop())
        # Credit is never lost: what remains unacknowledged is below the ack threshold
        # (and so the sender can always send again).
        assert self.send.in_flight == self.recv.outstanding == self.recv.pending
        assert self.send.in_flight < self.threshold
        assert self.send.available > 0
        assert self.send.window == self.recv.window

    def teardown(self) -> None:
        if hasattr(self, "send"):
            self.drain()


CreditLink.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_credit_link = CreditLink.TestCase


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(1, 5_000),
    minimum=st.integers(1, 5_000),
    total=st.integers(0, 50_000),
    chunks=st.lists(st.integers(1, 3_000), min_size=1, max_size=20),
)
def test_transfer_always_completes_without_flush(
    window: int, minimum: int, total: int, chunks: list[int]
) -> None:
    """A reader that consumes everything it gets lets any amount through, using only the
    batched acks of ``consumed`` (no flush): the threshold never exceeds the window."""
    send = SendCredit(window)
    recv = ReceiveWindow(window, default_ack_threshold(window, minimum))
    remaining = total
    delivered = 0
    step = 0
    while remaining:
        n = min(send.available, remaining, chunks[step % len(chunks)])
        step += 1
        assert n > 0, "sender stalled: credit was lost"
        send.consume(n)
        remaining -= n
        assert recv.received(n)
        delivered += n
        credit = recv.consumed(n)
        if credit:
            assert send.release(credit)
    assert delivered == total
    assert send.in_flight == recv.outstanding < recv.threshold
