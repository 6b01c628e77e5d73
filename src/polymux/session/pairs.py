"""Stream pairs: two one-way streams as one two-way channel (omnistreams).

On a format whose streams carry data from their opener to their acceptor only
(``Engine.one_way``), ``SessionCore.open_pair`` opens a stream to the peer with the creation
metadata ``{"pair": token}``; a polymux peer opens one back with ``{"replyTo": token}``, and
the two make a ``(reader, writer)``. The core does both sides:

* the peer's ``{"pair": ...}`` stream: the core opens the other half back at once and
  reports both as an :class:`~polymux.session.events.IncomingPair` (for the handler, or
  ``accept_channel``); if it cannot (the session's limits), the peer's stream is reset and a
  :class:`~polymux.session.events.PairFailed` says why;
* the peer's ``{"replyTo": ...}`` stream: it completes our pair (a
  :class:`~polymux.session.events.PairAnswered`), or is reset when nobody waits for it (the
  pair was given up, or the token is not ours).

A pair whose first half finishes before the answer fails with the reason. A peer that does
not answer pairs (not polymux) never completes one: the application bounds the wait.
"""

from __future__ import annotations

import os
from typing import Any

from polymux.exceptions import ChannelClosedError
from polymux.session import events as ce


__all__ = ["PAIR", "REPLY", "Pairs", "pair_role"]

PAIR = "pair"
"""The metadata key of the first half of a pair."""
REPLY = "replyTo"
"""The metadata key of the second half, naming the first half's token."""


def pair_role(meta: dict[str, Any] | None) -> tuple[str, str] | None:
    """``(PAIR, token)`` for the first half of a stream pair, ``(REPLY, token)`` for the
    answer to one, None for a plain stream (``meta``: its creation metadata object)."""
    if not meta:
        return None
    for key in (PAIR, REPLY):
        token = meta.get(key)
        if isinstance(token, str):
            return key, token
    return None


class Pairs:
    """Our pairs that wait for the peer's answer."""

    __slots__ = ("format", "handles", "tokens")

    def __init__(self, fmt: str) -> None:
        self.format = fmt
        self.handles: dict[str, int] = {}
        """token -> the first half we opened."""
        self.tokens: dict[int, str] = {}
        """The same, by handle."""

    @staticmethod
    def new_token() -> str:
        """A token no peer can guess (it names our pair in the peer's answer)."""
        return os.urandom(8).hex()

    def wait(self, token: str, handle: int) -> None:
        """Our first half ``handle`` (metadata ``{"pair": token}``) awaits its answer."""
        self.handles[token] = handle
        self.tokens[handle] = token

    def answer(self, token: str, inbound: int) -> ce.PairAnswered | None:
        """The peer's ``{"replyTo": token}`` stream ``inbound``: the pair it completes, or
        None when nobody waits for it."""
        handle = self.handles.pop(token, None)
        if handle is None:
            return None
        del self.tokens[handle]
        return ce.PairAnswered(handle, inbound, None)

    def finished(self, handle: int, error: Exception | None) -> ce.PairAnswered | None:
        """A channel finished: if it was the first half of a pair still waiting, the pair
        fails."""
        token = self.tokens.pop(handle, None)
        if token is None:
            return None
        del self.handles[token]
        error = error or ChannelClosedError(
            f"{self.format}: the stream pair ended before the peer answered it"
        )
        return ce.PairAnswered(handle, None, error)
