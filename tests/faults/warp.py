"""An event loop whose clock jumps ahead when it would only wait: a test of real sockets
(client, proxy and server in one loop) with the default timeouts of tens of seconds runs
in about a second of wall time.

:class:`WarpLoop` is asyncio's selector loop with ``time()`` = the monotonic clock + an
offset. When the loop would sleep until its next timer, its selector polls for I/O
(``REAL_WAIT``); if none is ready, the offset jumps to the timer. Bytes written to a
loopback socket are readable at once, so with every party in this loop nothing is lost by
not waiting for real. While a thread of the loop's executor works (getaddrinfo,
``asyncio.to_thread``) the clock does not jump. (Other processes and threads of
their own would be missed: a test that uses them must not use this loop.) :func:`run` runs a coroutine on one, with
polymux's drivers reading the same clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import polymux.aio.session
import polymux.anyio


T = TypeVar("T")

REAL_WAIT = 0.0
"""Real seconds the selector waits for I/O before the clock jumps: none, it polls. Loopback
bytes are readable once the write that sent them returns (the kernel delivers them within
the system call), and asyncio and anyio set TCP_NODELAY, so the kernel holds none back."""


class _WarpSelector(selectors.BaseSelector):
    """The default selector, which jumps its loop's clock instead of sleeping (unless a
    thread of the loop's executor is at work: it waits for real then)."""

    def __init__(self) -> None:
        self._inner = selectors.DefaultSelector()
        self.offset = 0.0
        self.jumped = 0.0
        self.threads = 0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout <= REAL_WAIT or self.threads:
            return self._inner.select(timeout)
        start = time.monotonic()
        ready = self._inner.select(REAL_WAIT)
        if not ready:
            jump = max(0.0, timeout - (time.monotonic() - start))
            self.offset += jump
            self.jumped += jump
        return ready


class WarpLoop(asyncio.SelectorEventLoop):
    """See the module docstring; ``warped``: seconds skipped so far."""

    def __init__(self) -> None:
        self._warp = _WarpSelector()
        super().__init__(self._warp)

    def time(self) -> float:
        return time.monotonic() + self._warp.offset

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> asyncio.Future[Any]:
        # (getaddrinfo and asyncio.to_thread come here) no jump while a thread works
        self._warp.threads += 1
        future = super().run_in_executor(executor, func, *args)
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _future: asyncio.Future[Any]) -> None:
        self._warp.threads -= 1

    @property
    def warped(self) -> float:
        """Seconds the clock jumped in all."""
        return self._warp.jumped


@contextlib.contextmanager
def _drivers_on(loop: WarpLoop) -> Iterator[None]:
    """polymux's drivers read ``time.monotonic`` for the session core: the loop's clock."""
    saved = polymux.aio.session._clock, polymux.anyio._clock
    polymux.aio.session._clock = polymux.anyio._clock = loop.time
    try:
        yield
    finally:
        polymux.aio.session._clock, polymux.anyio._clock = saved


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end on a new :class:`WarpLoop`."""
    loop = WarpLoop()
    try:
        with _drivers_on(loop), asyncio.Runner(loop_factory=lambda: loop) as runner:
            return runner.run(coro)
    finally:
        if not loop.is_closed():
            loop.close()
