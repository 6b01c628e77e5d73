"""Requests: send a body on a new channel, end it, and collect the peer's whole answer.

Streamux's request/response, usable on every two-way format. ``SessionCore.request`` opens
the channel, queues the body and our end, and moves the channel's receiving half to
:attr:`~polymux.session.channels.Receiving.ANSWER`: what arrives is collected here (its
credit goes back at once) instead of going to a reader. The answer is complete at the
peer's end, or when the channel finishes cleanly; an
:class:`~polymux.session.events.Answered` event carries its parts, or the error (the open was
refused, the channel was reset, the session ended, the answer passed its ``limit``).
"""

from __future__ import annotations

from polymux._types import BytesLike
from polymux.exceptions import LimitExceeded
from polymux.session import events as ce


__all__ = ["Requests"]


class _Answer:
    __slots__ = ("error", "limit", "parts", "size")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.error: Exception | None = None  # why the open failed, before the channel finished


class Requests:
    """The requests whose answers are not complete yet, by channel handle."""

    __slots__ = ("answers", "format")

    def __init__(self, fmt: str) -> None:
        self.format = fmt
        self.answers: dict[int, _Answer] = {}

    def __contains__(self, handle: int) -> bool:
        return handle in self.answers

    def start(self, handle: int, limit: int | None) -> None:
        """Collect the answer of ``handle`` (at most ``limit`` bytes)."""
        self.answers[handle] = _Answer(limit)

    def data(self, handle: int, data: BytesLike, more: tuple[BytesLike, ...]) -> ce.Answered | None:
        """Bytes of the answer (copied: they may be views of the received chunk). Returns
        the failure once the answer passes its limit (the core then resets the channel)."""
        answer = self.answers[handle]
        for part in (data, *more):
            answer.parts.append(bytes(part))
            answer.size += len(part)
        if answer.limit is not None and answer.size > answer.limit:
            del self.answers[handle]
            error = LimitExceeded(f"{self.format}: the answer exceeds limit={answer.limit} bytes")
            return ce.Answered(handle, None, error)
        return None

    def open_failed(self, handle: int, error: Exception) -> None:
        """The peer refused the request's channel (its end follows)."""
        self.answers[handle].error = error

    def ended(self, handle: int) -> ce.Answered:
        """The peer ended its writing: the answer is complete."""
        return ce.Answered(handle, self.answers.pop(handle).parts, None)

    def finished(self, handle: int, error: Exception | None) -> ce.Answered | None:
        """The channel finished: a clean end completes the answer, an error fails it."""
        answer = self.answers.pop(handle, None)
        if answer is None:
            return None
        error = error or answer.error
        if error is not None:
            return ce.Answered(handle, None, error)
        return ce.Answered(handle, answer.parts, None)

    def forget(self, handle: int) -> None:
        """The application no longer waits for the answer (a cancelled request)."""
        self.answers.pop(handle, None)
