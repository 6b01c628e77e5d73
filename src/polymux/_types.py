"""Shared type aliases."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeAlias


BytesLike: TypeAlias = bytes | bytearray | memoryview
"""What polymux accepts wherever it takes bytes."""


class CaptureSink(Protocol):
    """Where a session hands the raw bytes it sends and receives when capture is on
    (``SessionConfig(capture=...)``). :mod:`polymux.tracing` provides the recorder; any
    object with these three methods works. Called on the event loop: keep it cheap."""

    def received(self, data: BytesLike) -> None:
        """Bytes that arrived from the peer, in order."""

    def sent(self, chunks: Sequence[BytesLike]) -> None:
        """Bytes handed to the socket, in order (one batch, possibly several parts)."""

    def close(self) -> None:
        """The connection is gone: flush and release."""


CaptureFactory: TypeAlias = Callable[[Mapping[str, str]], CaptureSink]
"""``factory(info) -> CaptureSink``, called once per session when its connection is made.
``info`` has ``format``, ``role`` (``client``/``server``), ``local`` and ``peer``
(addresses as text, may be empty)."""
