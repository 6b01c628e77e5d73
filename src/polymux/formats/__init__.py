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

from polymux.engine.smux import SmuxOptions
from polymux.engine.spec import Capabilities, FormatOptions, NoOptions
from polymux.engine.streamux import StreamuxOptions
from polymux.engine.yamux import YamuxOptions
from polymux.formats import mplex, mstream, omnistreams, smux, streamux, yamux
from polymux.formats.registry import (
    FORMATS,
    PROTOCOLS,
    EngineFactory,
    Format,
    FormatDocs,
    get,
    make_engine,
    register,
    resolve,
    unregister,
)
from polymux.formats.signature import Fit, Probe, Signature
from polymux.formats.walk import Codec, FrameWalk, Walk, WalkHost


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
    "get",
    "make_engine",
    "register",
    "resolve",
    "unregister",
]

for _fmt in (
    *mstream.FORMATS,
    *mplex.FORMATS,
    yamux.YAMUX,
    streamux.STREAMUX,
    *omnistreams.FORMATS,
    *smux.FORMATS,
):
    register(_fmt)
del _fmt
