"""Channel records, their states, and the transition tables of the format engines.

Rules every engine keeps (h2's ``stream.py`` and h11's ``_state.py`` shape):

* Rule 1: a channel's state changes only through its format's transition table
  (:class:`Transitions`, applied by ``Engine._step``): ``(state, input) -> outcome``. The
  outcome is the new state; :data:`IGNORE` (legal, and the input is dropped: a benign race
  such as a repeated close); or a :class:`Refuse` (an error with its own message). Anything
  not in the table is an error too: a ``ProtocolError`` for what the peer sent, a
  ``RuntimeError`` for a command of ours (a bug in the caller).
* Rule 2: :attr:`ChannelState.CLOSED` means forgotten: reaching it drops the record from
  the engine's tables. Closed and reset channels have no other state.
* Rule 3: the table decides *whether* and *where to*; the engine does the wire work of the
  transition (frames to send, events to report) after it.
* Rule 4: what a format keeps per channel beyond the common fields lives in typed fields of
  a :class:`ChannelRecord` subclass of its own.

:data:`HALF_CLOSE` is the life most formats share (open, accept, half-close each way,
reset); a format's table starts from it and changes what differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Final, Literal, Self

from polymux.engine.flow import ReceiveWindow, SendCredit
from polymux.exceptions import ProtocolError


if TYPE_CHECKING:
    from polymux.engine.plane import Inbox


__all__ = [
    "HALF_CLOSE",
    "IGNORE",
    "ChannelRecord",
    "ChannelState",
    "Input",
    "Refuse",
    "Transitions",
]


class ChannelState(Enum):
    """Where a channel is in its life.

    ``OFFERED_*`` channels wait for acceptance; ``OPEN`` ones carry data both ways;
    ``HALF_CLOSED_LOCAL`` means we finished writing, ``HALF_CLOSED_REMOTE`` that the peer
    did; ``CLOSING`` that both did and the engine still keeps the channel a moment.
    """

    IDLE = "idle", False, False, False
    """Not created yet (the state a table's opening inputs start from)."""
    OFFERED_LOCAL = "offered-local", False, False, False
    """We offered it; the peer has not accepted yet."""
    OFFERED_REMOTE = "offered-remote", False, False, False
    """The peer offered it; we have not accepted yet."""
    OFFERED_REMOTE_ENDED = "offered-remote-ended", False, False, True
    """The peer offered it and already ended its writing; we have not accepted yet (a whole
    short channel can arrive in one read)."""
    OPEN = "open", True, False, False
    HALF_CLOSED_LOCAL = "half-closed-local", True, True, False
    HALF_CLOSED_REMOTE = "half-closed-remote", True, False, True
    CLOSING = "closing", True, True, True
    """Both sides ended; the engine keeps the channel until the I/O layer has seen it."""
    CLOSED = "closed", True, True, True
    """Forgotten (rule 2)."""

    accepted: bool
    """Whether the channel was accepted (it is past its offer)."""
    local_end: bool
    """Whether we ended our writing."""
    remote_end: bool
    """Whether the peer ended its writing."""

    def __new__(cls, value: str, accepted: bool, local_end: bool, remote_end: bool) -> Self:
        state = object.__new__(cls)
        state._value_ = value
        state.accepted = accepted
        state.local_end = local_end
        state.remote_end = remote_end
        return state

    # Identity hashing (Enum's own hashes the name in Python): states key the tables and
    # the receive fast path's sets.
    __hash__ = object.__hash__


class Input(Enum):
    """What can happen to a channel: a command of ours, or a frame from the peer."""

    OPEN = "open", False
    """We open (offer) the channel."""
    ACCEPT = "accept", False
    REJECT = "reject", False
    SEND = "send on", False
    END = "end", False
    """We end our writing (half-close)."""
    RESET = "reset", False
    RECV_OPEN = "open", True
    """The peer opens (offers) a channel."""
    RECV_ACCEPT = "acceptance", True
    """The peer accepts our offer."""
    RECV_DATA = "data", True
    RECV_END = "end", True
    """The peer ends its writing."""
    RECV_RESET = "reset", True

    received: bool
    """True for what the peer sends, False for our commands."""

    def __new__(cls, value: str, received: bool) -> Self:
        member = object.__new__(cls)
        member._value_ = (value, received)
        member.received = received
        return member

    @property
    def label(self) -> str:
        """The input in words, for messages."""
        return str(self._value_[0])

    __hash__ = object.__hash__


class _Ignore(Enum):
    IGNORE = "ignore"


IGNORE: Final = _Ignore.IGNORE
"""The outcome of a legal input that changes nothing and is dropped."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """The outcome of an illegal input, with its message.

    ``message`` may name ``{channel}`` (its description), ``{id}`` (its wire id),
    ``{state}`` and ``{input}``. Received inputs raise ``error`` (a ``ProtocolError``
    subclass); commands of ours raise ``RuntimeError``.
    """

    message: str
    error: type[ProtocolError] = ProtocolError


Outcome = ChannelState | Literal[_Ignore.IGNORE] | Refuse
"""What a table says of one ``(state, input)``."""

_DEFAULT_REFUSALS: Mapping[Input, Refuse] = {
    **{
        i: Refuse(
            "{input} for {channel} in state {state}"
            if i.received
            else "cannot {input} {channel} in state {state}"
        )
        for i in Input
    },
    Input.ACCEPT: Refuse("{channel} is not a pending incoming stream"),
    Input.REJECT: Refuse("{channel} is not a pending incoming stream"),
}


class Transitions:
    """One format's channel state machine (for one role, where the roles differ).

    Args:
        moves: ``(state, input) -> outcome``; what is missing is refused.
        refusals: the refusal of an input wherever ``moves`` has none, by input (default:
            "... in state ..." messages; ACCEPT and REJECT: "not a pending incoming stream").
    """

    __slots__ = ("moves", "receiving", "refusals", "sending")

    def __init__(
        self, moves: Mapping[tuple[ChannelState, Input], Outcome], refusals: Mapping[Input, str] | None = None
    ) -> None:
        self.moves: dict[tuple[ChannelState, Input], Outcome] = dict(moves)
        self.refusals: dict[Input, Refuse] = {
            **_DEFAULT_REFUSALS,
            **{i: Refuse(message) for i, message in (refusals or {}).items()},
        }
        self.receiving = frozenset(s for (s, i), to in self.moves.items() if i is Input.RECV_DATA and to is s)
        """States in which data from the peer is delivered and changes nothing (the engines'
        receive fast path tests this instead of looking the table up per frame)."""
        self.sending = frozenset(s for (s, i), to in self.moves.items() if i is Input.SEND and to is s)
        """States in which we may send data."""

    def outcome(self, state: ChannelState, input_: Input) -> Outcome:
        """What the table says of ``input_`` in ``state`` (its refusal when it has nothing)."""
        return self.moves.get((state, input_)) or self.refusals[input_]


_S = ChannelState
_I = Input
_LIVE = (
    _S.OFFERED_LOCAL,
    _S.OFFERED_REMOTE,
    _S.OFFERED_REMOTE_ENDED,
    _S.OPEN,
    _S.HALF_CLOSED_LOCAL,
    _S.HALF_CLOSED_REMOTE,
    _S.CLOSING,
)

HALF_CLOSE: Mapping[tuple[ChannelState, Input], Outcome] = {
    (_S.IDLE, _I.OPEN): _S.OPEN,  # usable at once (no acceptance on the wire)
    (_S.IDLE, _I.RECV_OPEN): _S.OFFERED_REMOTE,
    (_S.OFFERED_REMOTE, _I.ACCEPT): _S.OPEN,
    (_S.OFFERED_REMOTE_ENDED, _I.ACCEPT): _S.HALF_CLOSED_REMOTE,
    (_S.OFFERED_REMOTE, _I.REJECT): _S.CLOSED,
    (_S.OFFERED_REMOTE_ENDED, _I.REJECT): _S.CLOSED,
    (_S.OPEN, _I.SEND): _S.OPEN,
    (_S.HALF_CLOSED_REMOTE, _I.SEND): _S.HALF_CLOSED_REMOTE,
    (_S.OPEN, _I.END): _S.HALF_CLOSED_LOCAL,
    (_S.HALF_CLOSED_REMOTE, _I.END): _S.CLOSED,
    (_S.HALF_CLOSED_LOCAL, _I.END): IGNORE,  # ended already: nothing more to send
    # Data is legal before the acceptance: it may arrive in the read that opened the channel.
    (_S.OFFERED_REMOTE, _I.RECV_DATA): _S.OFFERED_REMOTE,
    (_S.OPEN, _I.RECV_DATA): _S.OPEN,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_DATA): _S.HALF_CLOSED_LOCAL,
    (_S.OFFERED_REMOTE, _I.RECV_END): _S.OFFERED_REMOTE_ENDED,
    (_S.OPEN, _I.RECV_END): _S.HALF_CLOSED_REMOTE,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_END): _S.CLOSED,
    **{(s, _I.RESET): _S.CLOSED for s in _LIVE},
    **{(s, _I.RECV_RESET): _S.CLOSED for s in _LIVE},
}
"""The life most formats share: opened usable at once, accepted, half-closed each way,
reset either way from anywhere. Tables add what their format has beyond it (offers that
wait for acceptance, what to do with data after the peer's end ...)."""


@dataclass(slots=True, eq=False)
class ChannelRecord:
    """What an engine knows about one live channel (a format with more subclasses it)."""

    handle: int
    """The engine-assigned handle events use."""
    wire_id: int
    """The id on the wire."""
    local_origin: bool
    """True when we opened (offered) the channel."""
    name: str
    send: SendCredit
    recv: ReceiveWindow | None
    """``None`` when the format has no receive flow control."""
    state: ChannelState
    """Changed only through the format's transition table (rule 1)."""
    full_header: tuple[int, bytes] | None = None
    """``(size, header)`` of a data frame of the engine's full frame size on this channel
    (bulk writes send it again and again: encoded once, kept by ``Engine._queue_frames``)."""
    inbox: Inbox | None = None
    """Where the channel's data frames go (its reader is a stream: the session core
    attaches it); None: they become ``DataReceived`` events."""

    @property
    def local_end(self) -> bool:
        """Whether we ended our writing."""
        return self.state.local_end

    @property
    def remote_end(self) -> bool:
        """Whether the peer ended its writing."""
        return self.state.remote_end

    def describe(self) -> str:
        """A short label for messages: ``channel 3 (local, 'name')``."""
        origin = "local" if self.local_origin else "remote"
        return f"channel {self.wire_id} ({origin}, {self.name!r})"
