"""A capture factory that hands each session to several recorders (tests that compare
what two capture modes wrote for the same traffic)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polymux._types import BytesLike


class Tee:
    """A capture factory handing every session to several recorders."""

    def __init__(self, *factories: Any) -> None:
        self.factories = factories

    def __call__(self, info: Mapping[str, str]) -> TeeSink:
        return TeeSink([f(info) for f in self.factories])


class TeeSink:
    """One session's sinks, fed alike."""

    def __init__(self, sinks: list[Any]) -> None:
        self.sinks = sinks

    def received(self, data: BytesLike) -> None:
        for s in self.sinks:
            s.received(data)

    def sent(self, chunks: Sequence[BytesLike]) -> None:
        for s in self.sinks:
            s.sent(chunks)

    def close(self) -> None:
        for s in self.sinks:
            s.close()
