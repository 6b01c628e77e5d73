"""What the core does beyond moving channel bytes, for every driver: stream pairs on one-way
formats (omnistreams), requests (send a body, end, collect the whole answer), and two
corners of a read (an open too many ends the session mid-read; a held response whose
request ended meanwhile)."""

from __future__ import annotations

import pytest

from polymux.exceptions import (
    ChannelClosedError,
    ChannelRejected,
    ChannelReset,
    LimitExceeded,
    PolymuxError,
    SessionClosed,
)
from polymux.session import events as ce
from polymux.session.channels import Receiving
from polymux.session.pairs import pair_role

from .corekit import drain, of, one, pair, pump, received


# -- stream pairs ------------------------------------------------------------------------------


def test_a_pair_is_two_one_way_streams_matched_by_token() -> None:
    """open_pair: our stream carries {"pair": token}; the peer's core opens one back with
    {"replyTo": token} at once and reports both as an IncomingPair; ours completes with a
    PairAnswered. Each side writes on one and reads on the other."""
    a, b = pair("omnistreams")
    x = a.open_pair("chat")
    token = a.engine.metadata_object(x)["pair"]  # type: ignore[index]
    pump(a, b)
    incoming = one(b.events(), ce.IncomingPair)
    assert incoming.name == "chat" and not of(b.events(), ce.Incoming)
    assert b.engine.metadata_object(incoming.reply) == {"name": "chat", "chunkSize": 65536, "replyTo": token}
    answered = one(a.events(), ce.PairAnswered)
    assert answered.handle == x and answered.error is None and answered.inbound is not None
    a.write(x, b"ping")
    b.write(incoming.reply, b"pong")
    pump(a, b)
    assert received(b.events(), incoming.handle) == b"ping"
    assert received(a.events(), answered.inbound) == b"pong"
    assert not a.pairs.handles and not a.pairs.tokens


def test_a_pair_without_a_handler_waits_in_the_accept_backlog() -> None:
    """Without a handler the peer's pair counts in the accept backlog until taken; the
    answer to our own pair never does."""
    a, b = pair("omnistreams", server_handler=False, client={"handler": False})
    a.open_pair("p")
    pump(a, b)
    incoming = one(b.events(), ce.IncomingPair)
    assert b.table.untaken == 1
    b.taken(incoming.handle)
    assert b.table.untaken == 0
    assert one(a.events(), ce.PairAnswered).error is None
    assert a.table.untaken == 0


def test_an_answer_nobody_waits_for_is_reset() -> None:
    """A {"replyTo": ...} stream for no pair of ours (given up, or not ours) is reset."""
    a, b = pair("omnistreams")
    stray = b.open_channel("stray", {"replyTo": "not-a-token"})
    pump(a, b)
    assert not of(a.events(), ce.Incoming) and not a.channels
    assert one(b.events(), ce.Finished).handle == stray
    assert stray not in b.channels


def test_a_pair_the_peer_cannot_answer_fails_on_both_sides() -> None:
    """The peer's core cannot open the other half (max_outbound_channels): its half is
    reset and a PairFailed says why; our pair fails with the reset."""
    a, b = pair("omnistreams", server={"max_outbound_channels": 1})
    b.open_channel("taken")  # the peer's only outbound stream
    pump(a, b)
    a.events()
    x = a.open_pair("p")
    pump(a, b)
    failed = one(b.events(), ce.PairFailed)
    assert failed.name == "p" and isinstance(failed.error, LimitExceeded)
    answered = one(a.events(), ce.PairAnswered)
    assert answered.handle == x and answered.inbound is None
    assert isinstance(answered.error, ChannelReset)


def test_a_pair_given_up_before_its_answer_fails_and_its_answer_is_reset() -> None:
    """Resetting our half before the answer ends the wait (PairAnswered with an error);
    the answer that still comes is reset."""
    a, b = pair("omnistreams")
    x = a.open_pair("p")
    a.reset(x)
    answered = one(a.events(), ce.PairAnswered)
    assert answered.inbound is None and isinstance(answered.error, ChannelClosedError)
    assert "the stream pair ended before the peer answered it" in str(answered.error)
    pump(a, b)
    assert not a.channels and not of(a.events(), ce.Incoming)


def test_only_the_metadata_of_a_pair_makes_one() -> None:
    assert pair_role(None) is None and pair_role({}) is None
    assert pair_role({"name": "x", "chunkSize": 1}) is None
    assert pair_role({"pair": 7}) is None  # a token is a string
    assert pair_role({"pair": "t"}) == ("pair", "t") and pair_role({"replyTo": "t"}) == ("replyTo", "t")


def test_other_channels_finishing_leave_waiting_pairs_and_requests_alone() -> None:
    a, _b = pair("omnistreams")
    x = a.open_pair("p")
    other = a.open_channel("other")
    a.reset(other)
    events = a.events()
    assert of(events, ce.Finished) == [ce.Finished(other)] and not of(events, ce.PairAnswered)
    assert a.pairs.tokens == {x: a.engine.metadata_object(x)["pair"]}  # type: ignore[index]
    c, _d = pair("yamux")
    r = c.request("", b"q")
    c.reset(c.open_channel("other"))
    assert not of(c.events(), ce.Answered) and r in c.requests


def test_pairs_are_for_one_way_formats() -> None:
    a, _b = pair("yamux")
    with pytest.raises(PolymuxError, match="channels carry data both ways"):
        a.open_pair("p")


# -- requests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["yamux", "mstream-v3", "mplex", "streamux", "smux-v2"])
def test_a_request_sends_its_body_and_end_and_collects_the_whole_answer(fmt: str) -> None:
    """request(): the body and our end go out; what the peer sends back is collected (no
    Data events, credit returned at once) and handed over whole at its end; the channel is
    then closed."""
    a, b = pair(fmt, receive_window=256 * 1024)
    x = a.request("q", b"question" * 1000)
    pump(a, b)
    events = b.events()
    y = one(events, ce.Incoming).handle
    assert received(events, y) == b"question" * 1000 and of(events, ce.Ended) == [ce.Ended(y)]
    answer = bytes(range(256)) * 2048  # 512 KiB: twice the window, so credit must come back
    b.write(y, answer)
    b.write_eof(y)
    pump(a, b)
    events = a.events()
    assert not of(events, ce.Data)
    answered = one(events, ce.Answered)
    assert (answered.handle, answered.error) == (x, None) and b"".join(answered.parts or []) == answer
    assert x not in a.requests and a.budget.unread == 0
    pump(a, b)
    assert not a.channels and not b.channels


def test_an_empty_request_and_an_answer_within_its_limit() -> None:
    a, b = pair("yamux")
    x = a.request("", b"", limit=5)
    pump(a, b)
    y = one(b.events(), ce.Incoming).handle
    b.write(y, b"12345")
    b.write_eof(y)
    pump(a, b)
    assert one(a.events(), ce.Answered) == ce.Answered(x, [b"12345"], None)


def test_an_answer_past_its_limit_fails_and_resets_the_channel() -> None:
    a, b = pair("yamux")
    x = a.request("", b"q", limit=5)
    pump(a, b)
    y = one(b.events(), ce.Incoming).handle
    b.write(y, b"123456")
    pump(a, b)
    answered = one(a.events(), ce.Answered)
    assert answered.handle == x and answered.parts is None
    assert isinstance(answered.error, LimitExceeded)
    assert str(answered.error) == "yamux: the answer exceeds limit=5 bytes"
    assert x not in a.channels
    assert isinstance(one(b.events(), ce.Finished).error, ChannelReset)


def test_a_refused_request_fails_with_the_refusal_and_no_open_failure_event() -> None:
    a, b = pair("mstream-v3", offer_filter=lambda name: name != "nope")
    x = a.request("nope", b"q")
    pump(a, b)
    events = a.events()
    assert not of(events, ce.OpenFailed)
    answered = one(events, ce.Answered)
    assert answered.handle == x and isinstance(answered.error, ChannelRejected)


def test_a_request_reset_by_the_peer_fails_and_a_cancelled_one_says_nothing() -> None:
    a, b = pair("yamux")
    x, y = a.request("", b"one"), None
    pump(a, b)
    y = one(b.events(), ce.Incoming).handle
    b.reset(y, "no")
    pump(a, b)
    assert isinstance(one(a.events(), ce.Answered).error, ChannelReset)
    z = a.request("", b"two")
    pump(a, b)
    b.events()
    a.cancel_request(z)
    events = a.events()
    assert not of(events, ce.Answered) and one(events, ce.Finished).handle == z
    assert x not in a.channels and z not in a.channels


def test_a_request_whose_channel_ends_cleanly_before_the_peers_end_has_its_answer() -> None:
    """A request channel that finishes cleanly (here: the application resets it without
    cancelling the request) hands over what was collected: as a reader would read it up
    to its end."""
    a, b = pair("yamux")
    x = a.request("", b"q")
    pump(a, b)
    y = one(b.events(), ce.Incoming).handle
    b.write(y, b"partial")
    pump(a, b)
    assert a.channels[x].receiving is Receiving.ANSWER
    a.reset(x)
    assert one(a.events(), ce.Answered) == ce.Answered(x, [b"partial"], None)


def test_requests_end_with_the_session() -> None:
    a, _b = pair("yamux")
    x = a.request("", b"q")
    a.connection_lost(None)
    answered = one(a.events(), ce.Answered)
    assert answered.handle == x and isinstance(answered.error, SessionClosed)
    with pytest.raises(SessionClosed):
        a.request("", b"q")


def test_one_way_formats_have_no_requests() -> None:
    a, _b = pair("omnistreams")
    with pytest.raises(ChannelClosedError, match="a request has no way back"):
        a.request("", b"q")


# -- corners of a read -------------------------------------------------------------------------


def test_an_open_too_many_ends_the_session_and_the_rest_of_the_read_is_ignored() -> None:
    """Three opens in one read with a burst of one: the first is taken, the second ends
    the session (too fast), the third is not looked at."""
    a, b = pair("mplex", server={"inbound_channel_rate": 1})
    for i in range(3):
        a.open_channel(f"c{i}")
    b.receive_data(drain(a), 0.0)
    events = b.events()
    assert [e.name for e in of(events, ce.Incoming)] == ["c0"]
    assert "faster than 1 per second" in str(one(events, ce.Failed).error)
    assert b.engine.channel_count == 3 and len(b.channels) == 1  # decoded, never answered


def test_a_held_response_written_after_its_request_ended_is_sent_as_any() -> None:
    """Streamux: a response held until its request ends; the request ends, and the handler
    writes again before the scheduler ran: the format holds no more, so that write is queued
    (and may pause its writer) as any other."""
    a, b = pair("streamux", server={"write_buffer_high": 1000})
    x = a.open_channel()
    a.write(x, b"question")
    pump(a, b)
    y = one(b.events(), ce.Incoming).handle
    assert b.write(y, bytes(3000)) is False  # held: no pause
    assert b.channels[y].holding
    a.write_eof(x)
    b.receive_data(drain(a), 0.0)  # the request ends; nothing of ours went out yet
    assert b.write(y, bytes(10)) is True  # no longer held: over its mark, it pauses
    pump(a, b)
    assert len(received(a.events(), x)) == 3010
