"""The format registry: every wire format polymux speaks, declared once.

Each :class:`Format` names the format, says what it can do (:class:`Capabilities`), how to
build its engine, where its codec is, and how traces of it are decoded and detected.
Everything else (the CLI's choices, ``make_engine``, detection, the trace decoder, the
pipeline, the benchmarks, the apps) reads this table and never tests a format's name.

Adding a format: its codec module (``polymux.wire.<name>``), its engine module
(``polymux.engine.<name>``), and one entry below. When the entry names no trace tracker of
its own, the trace decoder and the detector use hooks of its codec module:
``trace_decoder(format)`` (an incremental decoder with ``feed`` and ``pending``),
``trace_frame(format, frame)`` (``(size, channel, frame_type, length, flags)``) and
``signature(format, c2s_head, s2c_head)`` (``(confidence, evidence)`` or ``None``).

This module imports nothing of polymux at import time (engines and codecs are loaded when
first asked for), so every layer may read it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from polymux.config import SessionConfig
    from polymux.engine.base import Engine


__all__ = ["FORMATS", "PROTOCOLS", "Capabilities", "Format", "get", "load"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a format can carry (the bridge and the docs' capability table read these)."""

    names: bool
    """The opener names a channel on the wire."""
    credit: str | None
    """Flow control on the wire: ``"bytes"`` (a window per channel), ``"messages"`` (a
    credit of messages), or ``None`` (none: bounded buffers and the slow-reader policy)."""
    ping: bool
    """The format has pings (keepalive, RTT)."""
    half_close: bool
    """A channel can end one direction and keep reading the other."""
    reset_message: bool
    """A reset carries the reason as text."""
    one_way: bool = False
    """Channels carry data from their opener to their acceptor only (omnistreams)."""
    handshake: bool = False
    """The session starts with a handshake (channels wait for it)."""
    conversation_option: str | None = None
    """The SessionConfig option a server sets so that one channel carries a conversation
    (Streamux's ``streamux_early_responses``; ``None``: channels always can)."""
    message_transport: bool = False
    """The format also runs over a message transport (WebSocket), one message per frame."""


@dataclass(frozen=True, slots=True)
class Format:
    """One wire format (see the module docstring)."""

    name: str
    """The ``protocol=`` name."""
    title: str
    """What the docs call it."""
    family: str
    """Formats of one family share a wire (mplex and multiplex differ in conventions only):
    detection names the family's first member when the bytes cannot tell."""
    caps: Capabilities
    factory: Callable[[SessionConfig | None, bool, bool], Engine]
    """``factory(config, is_client, message_mode)``: a new engine."""
    wire: str
    """The codec module."""
    trace: str | None = None
    """The trace tracker (``module:Class``) of :mod:`polymux.tracing.decode`; ``None``: the
    generic one, over the codec module's trace hooks."""
    options: tuple[tuple[str, Any], ...] = ()
    """Format-specific settings its own modules read (a version, a numbering, a limit)."""

    def make_engine(
        self, config: SessionConfig | None = None, *, is_client: bool = True, message_mode: bool = False
    ) -> Engine:
        """A new engine of this format."""
        if message_mode and not self.caps.message_transport:
            raise ValueError(f"{self.name} does not run over a message transport")
        return self.factory(config, is_client, message_mode)

    def option(self, name: str, default: Any = None) -> Any:
        """A format-specific setting (see :attr:`options`)."""
        return dict(self.options).get(name, default)

    def codec(self) -> Any:
        """The codec module."""
        return importlib.import_module(self.wire)


def load(path: str) -> Any:
    """The object a ``module:name`` path names."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


# -- the engines, built lazily -------------------------------------------------------------


def _mstream(version: int) -> Callable[[SessionConfig | None, bool, bool], Engine]:
    def make(config: SessionConfig | None, is_client: bool, message_mode: bool) -> Engine:
        from polymux.engine.mstream import MStreamEngine

        return MStreamEngine(version, config)

    return make


def _mplex(name: str) -> Callable[[SessionConfig | None, bool, bool], Engine]:
    def make(config: SessionConfig | None, is_client: bool, message_mode: bool) -> Engine:
        from polymux.engine.mplex import MplexEngine

        return MplexEngine(name, config)

    return make


def _yamux(config: SessionConfig | None, is_client: bool, message_mode: bool) -> Engine:
    from polymux.engine.yamux import YamuxEngine

    return YamuxEngine(config, is_client=is_client)


def _streamux(config: SessionConfig | None, is_client: bool, message_mode: bool) -> Engine:
    from polymux.engine.streamux import StreamuxEngine

    return StreamuxEngine(config)


def _omnistreams(numbering: str | None) -> Callable[[SessionConfig | None, bool, bool], Engine]:
    def make(config: SessionConfig | None, is_client: bool, message_mode: bool) -> Engine:
        from polymux.engine.omnistreams import OmnistreamsEngine

        return OmnistreamsEngine(config, numbering=numbering, message_mode=message_mode)

    return make


def _smux(version: int) -> Callable[[SessionConfig | None, bool, bool], Engine]:
    def make(config: SessionConfig | None, is_client: bool, message_mode: bool) -> Engine:
        from polymux.engine.smux import SmuxEngine

        return SmuxEngine(version, config, is_client=is_client)

    return make


_MSTREAM_CAPS = Capabilities(names=True, credit="bytes", ping=False, half_close=True, reset_message=True)

FORMATS: tuple[Format, ...] = (
    Format(
        "mstream-v1",
        "Nerdbank MultiplexingStream v1",
        "mstream-v1",
        Capabilities(
            names=True, credit=None, ping=False, half_close=True, reset_message=False, handshake=True
        ),
        _mstream(1),
        "polymux.wire.mstream",
        "polymux.tracing.decode:_MStreamTracker",
        (("version", 1),),
    ),
    Format(
        "mstream-v2",
        "Nerdbank MultiplexingStream v2",
        "mstream-v2",
        Capabilities(
            names=True, credit="bytes", ping=False, half_close=True, reset_message=True, handshake=True
        ),
        _mstream(2),
        "polymux.wire.mstream",
        "polymux.tracing.decode:_MStreamTracker",
        (("version", 2),),
    ),
    Format(
        "mstream-v3",
        "Nerdbank MultiplexingStream v3",
        "mstream-v3",
        _MSTREAM_CAPS,
        _mstream(3),
        "polymux.wire.mstream",
        "polymux.tracing.decode:_MStreamTracker",
        (("version", 3),),
    ),
    Format(
        "mplex",
        "mplex (libp2p)",
        "mplex",
        Capabilities(names=True, credit=None, ping=False, half_close=True, reset_message=False),
        _mplex("mplex"),
        "polymux.wire.mplex",
        "polymux.tracing.decode:_MplexTracker",
        (("max_message_size", 1024 * 1024),),
    ),
    Format(
        "multiplex",
        "multiplex (npm)",
        "mplex",
        Capabilities(names=True, credit=None, ping=False, half_close=True, reset_message=True),
        _mplex("multiplex"),
        "polymux.wire.mplex",
        "polymux.tracing.decode:_MplexTracker",
        (("max_message_size", 16 * 1024 * 1024), ("id_names", True)),
    ),
    Format(
        "yamux",
        "yamux (hashicorp)",
        "yamux",
        Capabilities(names=False, credit="bytes", ping=True, half_close=True, reset_message=False),
        _yamux,
        "polymux.wire.yamux",
        "polymux.tracing.decode:_YamuxTracker",
    ),
    Format(
        "streamux",
        "Streamux",
        "streamux",
        Capabilities(
            names=False,
            credit=None,
            ping=True,
            half_close=True,
            reset_message=False,
            handshake=True,
            conversation_option="streamux_early_responses",
        ),
        _streamux,
        "polymux.wire.streamux",
        "polymux.tracing.decode:_StreamuxTracker",
    ),
    Format(
        "omnistreams",
        "omnistreams (the spec's numbering)",
        "omnistreams",
        Capabilities(
            names=True,
            credit="messages",
            ping=False,
            half_close=False,
            reset_message=False,
            one_way=True,
            message_transport=True,
        ),
        _omnistreams(None),
        "polymux.wire.omnistreams",
        "polymux.tracing.decode:_OmniTracker",
        (("numbering", "spec"),),
    ),
    Format(
        "omnistreams-legacy",
        "omnistreams (npm omnistreams 0.9 numbering)",
        "omnistreams-legacy",
        Capabilities(
            names=True,
            credit="messages",
            ping=False,
            half_close=False,
            reset_message=False,
            one_way=True,
            message_transport=True,
        ),
        _omnistreams("legacy"),
        "polymux.wire.omnistreams",
        "polymux.tracing.decode:_OmniTracker",
        (("numbering", "legacy"),),
    ),
    Format(
        "smux",
        "smux v1 (xtaci)",
        "smux",
        Capabilities(names=False, credit=None, ping=True, half_close=True, reset_message=False),
        _smux(1),
        "polymux.wire.smux",
        None,
        (("version", 1),),
    ),
    Format(
        "smux-v2",
        "smux v2 (xtaci)",
        "smux-v2",
        Capabilities(names=False, credit="bytes", ping=True, half_close=True, reset_message=False),
        _smux(2),
        "polymux.wire.smux",
        None,
        (("version", 2),),
    ),
)
"""Every format, in the order the CLI and the docs list them."""

_BY_NAME = {f.name: f for f in FORMATS}

PROTOCOLS: tuple[str, ...] = tuple(f.name for f in FORMATS)
"""Protocol names polymux speaks (``protocol=``)."""


def get(name: str) -> Format:
    """The format named ``name``; ``ValueError`` naming the choices otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; polymux speaks: {', '.join(PROTOCOLS)}") from None
