"""Sans-I/O state machines, one per wire format, behind one interface (:class:`Engine`)."""

from __future__ import annotations

from polymux import formats
from polymux.config import SessionConfig
from polymux.engine.base import Engine


__all__ = ["Engine", "check_protocol", "make_engine"]


def check_protocol(protocol: str) -> str:
    """Return ``protocol`` if polymux speaks it; raise ``ValueError`` naming the choices."""
    formats.get(protocol)
    return protocol


def make_engine(
    protocol: str, config: SessionConfig | None = None, *, is_client: bool = True, message_mode: bool = False
) -> Engine:
    """Create the engine for ``protocol`` (one of :data:`polymux.PROTOCOLS`, as the format
    registry :mod:`polymux.formats` declares it).

    ``is_client`` tells which end of the connection this is, for formats whose id
    allocation depends on it; ``message_mode``: over a transport that keeps message
    boundaries (WebSocket), for formats that can.
    """
    return formats.get(protocol).make_engine(config, is_client=is_client, message_mode=message_mode)
