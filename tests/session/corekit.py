"""Helpers to drive :class:`~polymux.session.SessionCore` with bytes, application calls and
explicit times: no sockets, no event loop, no clock (h11's ConnectionPair shape)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from polymux.config import SessionConfig
from polymux.formats import make_engine
from polymux.session import SessionCore, events as ce


E = TypeVar("E", bound=ce.CoreEvent)

# Keepalive and idle deadlines are off unless a test asks for them: they would otherwise
# join every next_deadline() a test looks at.
QUIET: dict[str, Any] = {"keepalive_interval": None, "idle_timeout": None}


def config(**options: Any) -> SessionConfig:
    return SessionConfig(**{**QUIET, **options})


def core(
    fmt: str,
    *,
    client: bool = True,
    handler: bool = True,
    offer_filter: Callable[[str], bool] | None = None,
    now: float = 0.0,
    first_frame_deadline: bool = False,
    **options: Any,
) -> SessionCore:
    """One core, its connection made at ``now``."""
    cfg = config(**options)
    c = SessionCore(
        make_engine(fmt, cfg, is_client=client),
        cfg,
        now,
        offer_filter=offer_filter,
        has_handler=handler,
        first_frame_deadline=first_frame_deadline,
    )
    c.connection_made(now)
    return c


def pair(
    fmt: str,
    client: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    *,
    server_handler: bool = True,
    offer_filter: Callable[[str], bool] | None = None,
    **both: Any,
) -> tuple[SessionCore, SessionCore]:
    """A client core and a server core of ``fmt``, handshake done, events taken."""
    a = core(fmt, client=True, **{**both, **(client or {})})
    b = core(
        fmt, client=False, handler=server_handler, offer_filter=offer_filter, **{**both, **(server or {})}
    )
    pump(a, b)
    a.events()
    b.events()
    return a, b


def drain(c: SessionCore) -> bytes:
    """Everything ``c`` would write now (every batch), as one bytes."""
    chunks: list[bytes] = []
    while out := c.data_to_send():
        chunks.append(b"".join(bytes(p) for p in out))
    return b"".join(chunks)


def pump(a: SessionCore, b: SessionCore, now: float = 0.0, rounds: int = 100) -> None:
    """Move bytes both ways until neither has more to send."""
    for _ in range(rounds):
        moved = False
        for src, dst in ((a, b), (b, a)):
            if data := drain(src):
                dst.receive_data(data, now)
                moved = True
        if not moved:
            return
    raise AssertionError("the cores kept talking")


def of(events: Iterable[ce.CoreEvent], kind: type[E]) -> list[E]:
    return [e for e in events if isinstance(e, kind)]


def one(events: Iterable[ce.CoreEvent], kind: type[E]) -> E:
    (event,) = of(events, kind)
    return event


def open_to(a: SessionCore, b: SessionCore, name: str = "", now: float = 0.0) -> tuple[int, int]:
    """Open a channel from ``a``, accepted by ``b``: (a's handle, b's handle)."""
    mine = a.open_channel(name)
    pump(a, b, now)
    theirs = one(b.events(), ce.Incoming).handle
    a.events()
    return mine, theirs


def received(events: Iterable[ce.CoreEvent], handle: int) -> bytes:
    """The bytes the :class:`~ce.Data` events of ``handle`` carry, joined."""
    return b"".join(
        bytes(e.data) + b"".join(bytes(m) for m in e.more) for e in of(events, ce.Data) if e.handle == handle
    )
