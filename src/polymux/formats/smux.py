"""smux (xtaci/smux) protocol versions 1 and 2: the formats' definitions, their
frame-record walk and their signature.

The codec is :mod:`polymux.wire.smux`, the engine :class:`polymux.engine.smux.SmuxEngine`
(with its capabilities per version and :class:`~polymux.engine.smux.SmuxOptions`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from polymux.config import SessionConfig
from polymux.engine.base import Engine
from polymux.engine.smux import CAPABILITIES, SmuxEngine, SmuxOptions
from polymux.exceptions import ProtocolError
from polymux.formats.format import EngineFactory, Format, FormatDocs
from polymux.formats.signature import Fit, Probe, Signature
from polymux.formats.walk import Codec, FrameWalk, WalkHost
from polymux.wire import smux as wire
from polymux.wire.smux import Cmd


__all__ = ["FORMATS", "SMUX", "SMUX_V2", "SmuxWalk"]

_TYPES = {
    Cmd.SYN: "open",
    Cmd.FIN: "end",
    Cmd.PSH: "data",
    Cmd.NOP: "ping",
    Cmd.UPD: "window_update",
}


class SmuxWalk(FrameWalk):
    """smux: one record per frame (SYN ``open``, FIN ``end``, PSH ``data``, NOP ``ping``
    on no channel, UPD ``window_update`` whose length is the window it announces); the
    channel is the stream id. Credit is not followed."""

    def __init__(self, decoder: WalkHost, version: int) -> None:
        super().__init__(decoder)
        self.version = version

    def codec(self, direction: str) -> Codec:
        """The version's decoder."""
        return wire.Decoder(self.version, self.fmt)

    def frame(self, item: Any) -> tuple[int, int | None, str, int, int]:
        """``(size on the wire, stream id, frame type, length, cmd)``."""
        cmd = item.cmd
        body = item.body
        length = wire.decode_upd(body)[1] if cmd == Cmd.UPD else len(body)
        return (
            wire.HEADER_SIZE + len(body),
            (None if cmd == Cmd.NOP else item.stream_id),
            _TYPES[Cmd(cmd)],
            length,
            cmd,
        )


def _fits(probe: Probe, fmt: Format, version: int) -> list[Fit]:
    """How well the first bytes of each direction fit smux ``version`` (its protocol
    version in every header, and a client that starts by opening a stream or with a NOP).
    A first frame that is a NOP on stream 0 (what a smux session sends at once, its
    keepalive) has all of its 8 bytes fixed: near certain."""
    count = 0
    keepalive = False
    for head, allowed in ((probe.c2s, (Cmd.SYN, Cmd.NOP)), (probe.s2c, tuple(Cmd))):
        if not head:
            continue
        if head[0] != version:
            return []
        try:
            decoded = wire.Decoder(version, fmt.name).feed(head)
        except ProtocolError:
            return []
        if decoded and decoded[0].cmd not in allowed:
            return []
        count += len(decoded)
        keepalive = keepalive or head[: wire.HEADER_SIZE] == wire.encode_header(version, Cmd.NOP, 0)
    if not count:
        return []
    evidence = f"{count} smux version {version} frame{'s' * (count != 1)} (8-byte headers)"
    if keepalive:
        evidence += ", the first a NOP on stream 0 (its 8 bytes all fixed: smux's keepalive)"
        return [Fit(fmt.name, 0.95, evidence)]
    return [Fit(fmt.name, min(0.95, 0.5 + 0.1 * count), evidence)]


def _engine(version: int) -> EngineFactory:
    def make(fmt: Format, config: SessionConfig, is_client: bool, message_mode: bool) -> Engine:
        assert isinstance(fmt.options, SmuxOptions)
        return SmuxEngine(version, config, is_client=is_client, options=fmt.options)

    return make


_TESTED = "Go `xtaci/smux` 1.5.16 (Debian), both roles, TCP and unix"
_NAMES = "the acceptor sees the stream id"

SMUX: Format = Format(
    "smux",
    "smux v1 (xtaci)",
    "smux",
    CAPABILITIES[1],
    _engine(1),
    partial(SmuxWalk, version=1),
    Signature(lambda probe: _fits(probe, SMUX, 1), rank=50),
    SmuxOptions(),
    FormatDocs(
        page="formats/smux.md",
        tested_against=_TESTED,
        credit="the slow-reader policy",
        names=_NAMES,
        half_close=", but mind the Go library's half-close caveat (smux page)",
        pings="NOP keepalive only (nothing answers it, so no round-trip time)",
        limits="frames up to 65,535 bytes; both ends must be configured with the same version",
    ),
    versions=("smux-v2",),
)
"""smux protocol version 1 (xtaci's default): no flow control on the wire."""

SMUX_V2: Format = Format(
    "smux-v2",
    "smux v2 (xtaci)",
    "smux-v2",
    CAPABILITIES[2],
    _engine(2),
    partial(SmuxWalk, version=2),
    Signature(lambda probe: _fits(probe, SMUX_V2, 2), rank=50),
    SmuxOptions(),
    FormatDocs(
        page="formats/smux.md",
        tested_against=_TESTED,
        credit="a window per stream (UPD)",
        names=_NAMES,
        half_close=", with the same caveat",
        pings="NOP keepalive only",
        limits="frames up to 65,535 bytes; in flight at most half of the peer's session buffer "
        "(`SmuxOptions.peer_buffer`)",
    ),
    versions=("smux",),
)
"""smux protocol version 2: a byte window per stream (UPD)."""

FORMATS = (SMUX, SMUX_V2)
"""Both versions, in the registry's order."""
