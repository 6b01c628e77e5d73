"""Sans-I/O state machines, one per wire format, behind one interface (:class:`Engine`)."""

from __future__ import annotations

from polymux.config import SessionConfig
from polymux.engine.base import Engine
from polymux.wire import PROTOCOLS


__all__ = ["Engine", "check_protocol", "make_engine"]


def check_protocol(protocol: str) -> str:
    """Return ``protocol`` if polymux speaks it; raise ``ValueError`` naming the choices."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; polymux speaks: {', '.join(PROTOCOLS)}")
    return protocol


def make_engine(protocol: str, config: SessionConfig | None = None, *, is_client: bool = True) -> Engine:
    """Create the engine for ``protocol`` (one of :data:`polymux.wire.PROTOCOLS`).

    ``is_client`` tells which end of the connection this is, for formats whose id
    allocation depends on it.
    """
    check_protocol(protocol)
    if protocol == "streamux":
        from polymux.engine.streamux import StreamuxEngine

        return StreamuxEngine(config)
    if protocol == "yamux":
        from polymux.engine.yamux import YamuxEngine

        return YamuxEngine(config, is_client=is_client)
    if protocol in ("omnistreams", "omnistreams-legacy"):
        from polymux.engine.omnistreams import OmnistreamsEngine

        numbering = "legacy" if protocol == "omnistreams-legacy" else None
        return OmnistreamsEngine(config, numbering=numbering)
    if protocol in ("smux", "smux-v2"):
        from polymux.engine.smux import SmuxEngine

        return SmuxEngine(2 if protocol == "smux-v2" else 1, config, is_client=is_client)
    if protocol in ("mplex", "multiplex"):
        from polymux.engine.mplex import MplexEngine

        return MplexEngine(protocol, config)
    from polymux.engine.mstream import MStreamEngine

    return MStreamEngine(int(protocol[-1]), config)
