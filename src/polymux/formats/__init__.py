"""The wire formats polymux speaks: one :class:`Format` object each, in one registry.

A format is declared once, in its own module (``polymux.formats.yamux`` ...), over its
codec (:mod:`polymux.wire`) and its engine (:mod:`polymux.engine`, where its
:class:`Capabilities` and typed options are declared): its name, its capabilities, its
engine, its frame-record walk (bytes in, frame records out: what capture, decode and the
pipeline run), its detection signature, its typed options and what the docs tables say of
it. Everything else (the API's entry points, the CLI's choices, capture, decode,
detection, the bridge, the pipeline, the benchmarks, the docs) reads the registry and never
tests a format's name: :func:`register` adds a format for all of them at once (the design
page's checklist, "Adding a format", says what a new format's modules hold).

Names become objects once, where they enter polymux (:func:`resolve`); :meth:`Format.configure`
sets a format's typed options (:class:`StreamuxOptions`, :class:`SmuxOptions`,
:class:`YamuxOptions`): ``protocol=get("streamux").configure(early_responses=True)``. The
:class:`~polymux.SessionConfig` keywords older releases had for them
(``streamux_early_responses=True`` ...) still work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from polymux.engine.spec import Capabilities, FormatOptions, NoOptions
from polymux.formats.format import EngineFactory, Format, FormatDocs
from polymux.formats.registry import (
    FORMATS,
    PROTOCOLS,
    declare,
    get,
    make_engine,
    register,
    resolve,
    unregister,
)
from polymux.formats.signature import Fit, Probe, Signature
from polymux.formats.walk import Codec, FrameWalk, Walk, WalkHost


if TYPE_CHECKING:
    from polymux.engine.smux import SmuxOptions
    from polymux.engine.streamux import StreamuxOptions
    from polymux.engine.yamux import YamuxOptions


__all__ = [
    "FORMATS",
    "PROTOCOLS",
    "Capabilities",
    "Codec",
    "EngineFactory",
    "Fit",
    "Format",
    "FormatDocs",
    "FormatOptions",
    "FrameWalk",
    "NoOptions",
    "Probe",
    "Signature",
    "SmuxOptions",
    "StreamuxOptions",
    "Walk",
    "WalkHost",
    "YamuxOptions",
    "declare",
    "get",
    "make_engine",
    "register",
    "resolve",
    "unregister",
]


# The built-in formats, in the order the CLI and the docs list them; each module is
# loaded when one of its formats is first asked for.


def _mstream() -> Sequence[Format]:
    from polymux.formats import mstream

    return mstream.FORMATS


def _mplex() -> Sequence[Format]:
    from polymux.formats import mplex

    return mplex.FORMATS


def _yamux() -> Sequence[Format]:
    from polymux.formats import yamux

    return (yamux.YAMUX,)


def _streamux() -> Sequence[Format]:
    from polymux.formats import streamux

    return (streamux.STREAMUX,)


def _omnistreams() -> Sequence[Format]:
    from polymux.formats import omnistreams

    return omnistreams.FORMATS


def _smux() -> Sequence[Format]:
    from polymux.formats import smux

    return smux.FORMATS


declare(("mstream-v1", "mstream-v2", "mstream-v3"), _mstream)
declare(("mplex", "multiplex"), _mplex)
declare(("yamux",), _yamux)
declare(("streamux",), _streamux)
declare(("omnistreams", "omnistreams-legacy"), _omnistreams)
declare(("smux", "smux-v2"), _smux)


def __getattr__(name: str) -> Any:
    """The built-in formats' typed options, from their engine modules (loaded on first use)."""
    if name == "SmuxOptions":
        from polymux.engine.smux import SmuxOptions

        return SmuxOptions
    if name == "StreamuxOptions":
        from polymux.engine.streamux import StreamuxOptions

        return StreamuxOptions
    if name == "YamuxOptions":
        from polymux.engine.yamux import YamuxOptions

        return YamuxOptions
    raise AttributeError(f"module 'polymux.formats' has no attribute {name!r}")
