"""The core's channel state tables (session/channels.py): every transition, the steps that
are not in them, and what a channel's state says of it; then two channels' whole lives
through real cores, state by state."""

from __future__ import annotations

import pytest

from polymux.session import events as ce
from polymux.session.channels import RECEIVING, SENDING, CoreChannel, Receiving, Sending, Step

from .corekit import core, drain, of, one, open_to, pair, pump


def fresh(*, accepted: bool = True) -> CoreChannel:
    return CoreChannel(7, "n", "channel 7 ('n')", True, 100, 25, accepted=accepted)


def test_every_transition_of_both_tables_applies() -> None:
    for table, field in ((SENDING, "sending"), (RECEIVING, "receiving")):
        for (state, step), new in table.items():
            channel = fresh()
            setattr(channel, field, state)
            channel.step(step)
            assert getattr(channel, field) is new
            assert step.sending == (field == "sending")


def test_a_step_outside_the_tables_is_a_bug_named_with_the_channel_and_its_state() -> None:
    channel = fresh()
    with pytest.raises(RuntimeError, match=r"channel 7 \('n'\): cannot send the end while open"):
        channel.step(Step.SEND_END)
    with pytest.raises(RuntimeError, match=r"channel 7 \('n'\): cannot the peer's end while closed-ended"):
        channel.receiving = Receiving.CLOSED_ENDED
        channel.step(Step.PEER_END)
    assert repr(fresh(accepted=False)) == "<CoreChannel channel 7 ('n') offered/open>"


def test_what_a_state_says_of_the_channel() -> None:
    """The views the drivers and tests read (accepted, eof_requested ...) come from the
    states: one source of truth."""
    views = {
        Sending.OFFERED: (False, False, False, False),
        Sending.OFFERED_ENDING: (False, True, False, False),
        Sending.OPEN: (True, False, False, False),
        Sending.ENDING: (True, True, False, False),
        Sending.ENDED: (True, True, True, False),
        Sending.LINGERING: (True, True, True, True),
    }
    assert set(views) == set(Sending)
    for state, expected in views.items():
        channel = fresh()
        channel.sending = state
        assert (channel.accepted, channel.eof_requested, channel.eof_sent, channel.lingering) == expected
    closed_ended = {
        Receiving.OPEN: (False, False),
        Receiving.ENDED: (False, True),
        Receiving.ANSWER: (False, False),
        Receiving.CLOSED: (True, False),
        Receiving.CLOSED_ENDED: (True, True),
    }
    assert set(closed_ended) == set(Receiving)
    for receiving, (closing, ended) in closed_ended.items():
        channel = fresh()
        channel.receiving = receiving
        assert (channel.closing, channel.remote_ended) == (closing, ended)


def test_a_channel_offered_ended_then_accepted_sends_its_data_and_its_end() -> None:
    """MultiplexingStream (opens await acceptance): written and ended before the peer
    accepted it, the channel is OFFERED_ENDING; acceptance makes it ENDING, and the
    scheduler sends the data, then the end (ENDED)."""
    a, b = pair("mstream-v3")
    x = a.open_channel("early")
    assert a.channels[x].sending is Sending.OFFERED
    a.write(x, b"before acceptance")
    a.write_eof(x)
    assert a.channels[x].sending is Sending.OFFERED_ENDING
    pump(a, b)
    assert one(a.events(), ce.Accepted).handle == x
    assert a.channels[x].sending is Sending.ENDED
    events = b.events()
    y = one(events, ce.Incoming).handle
    assert b.channels[y].receiving is Receiving.ENDED
    assert of(events, ce.Ended) == [ce.Ended(y)]


def test_close_after_our_end_is_closed_not_lingering() -> None:
    """write_eof() then close(): the end went out before the close, so the channel is
    ENDED and CLOSED (no early Finished for the application: that is LINGERING's, where the
    close came first); it finishes with the peer's end."""
    a, b = pair("yamux")
    x, y = open_to(a, b)
    a.write_eof(x)
    pump(a, b)
    a.close_channel(x)
    channel = a.channels[x]
    assert (channel.sending, channel.receiving) == (Sending.ENDED, Receiving.CLOSED)
    assert not of(a.events(), ce.Finished)
    b.write_eof(y)
    pump(a, b)
    assert x not in a.channels and of(a.events(), ce.Finished) == [ce.Finished(x)]


def test_the_peers_end_on_a_closed_channel_is_not_reported() -> None:
    """CLOSED + the peer's end: CLOSED_ENDED, and no Ended event (the application closed)."""
    a, b = pair("mplex")
    x, y = open_to(a, b)
    b.close_channel(y)
    a.write_eof(x)
    b.receive_data(drain(a), 0.0)  # our end reaches the peer before its own goes out
    assert b.channels[y].receiving is Receiving.CLOSED_ENDED
    pump(a, b)
    events = b.events()
    assert not of(events, ce.Ended)
    assert of(events, ce.Finished) == [ce.Finished(y)]
    assert y not in b.channels


def test_a_core_starts_its_channels_by_the_formats_acceptance() -> None:
    """Ours start OFFERED where the peer must accept (MultiplexingStream), OPEN where opens
    are usable at once (yamux, mplex)."""
    assert core("mstream-v3").channels == {}
    for fmt, state in (("mstream-v3", Sending.OFFERED), ("yamux", Sending.OPEN), ("mplex", Sending.OPEN)):
        a, _b = pair(fmt)
        assert a.channels[a.open_channel("s")].sending is state
