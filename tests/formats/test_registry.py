"""The format registry (:mod:`polymux.formats.registry`): names become objects once, the
compatibility keywords of a format's options resolve onto them, and the built-in formats
are loaded only when one is asked for (``import polymux`` and the CLI's parsers load no
engine)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

import pytest

import polymux
from polymux import SessionConfig, formats
from polymux.formats import Format, StreamuxOptions, YamuxOptions

from .tinymux import NAME, TINYMUX


def test_names_need_no_module_and_objects_load_their_own() -> None:
    code = (
        "import sys, polymux\n"
        "from polymux.cli import build_parser\n"
        "build_parser()\n"
        "assert 'yamux' in polymux.PROTOCOLS\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('polymux.engine.', 'polymux.wire.')))\n"
        "assert not [m for m in loaded if m.rsplit('.', 1)[1] in ('yamux', 'mstream', 'mplex', 'smux')], loaded\n"
        "polymux.formats.get('yamux')\n"
        "assert 'polymux.engine.yamux' in sys.modules and 'polymux.engine.mstream' not in sys.modules\n"
        "assert len(polymux.formats.FORMATS) == len(polymux.PROTOCOLS)\n"
        "assert 'polymux.engine.mstream' in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_a_declared_format_loads_when_first_asked_for() -> None:
    calls: list[str] = []

    def load() -> Sequence[Format]:
        calls.append("load")
        return (TINYMUX,)

    formats.declare((NAME,), load)
    try:
        assert NAME in polymux.PROTOCOLS and calls == []
        with pytest.raises(ValueError, match="registered already"):
            formats.declare(("yamux", NAME), load)
        assert formats.get(NAME) is TINYMUX and formats.get(NAME) is TINYMUX
        assert calls == ["load"]
    finally:
        formats.unregister(NAME)
    assert NAME not in polymux.PROTOCOLS


def test_a_declared_module_must_define_its_formats() -> None:
    formats.declare(("nothing-here",), lambda: (TINYMUX,))
    try:
        with pytest.raises(
            LookupError, match="the module declared for format 'nothing-here' does not define it"
        ):
            formats.get("nothing-here")
    finally:
        del formats.registry._BY_NAME["nothing-here"]
        formats.registry._update()
    assert "nothing-here" not in polymux.PROTOCOLS


def test_resolve_maps_the_compatibility_keywords_onto_the_options() -> None:
    streamux = formats.get("streamux")
    assert formats.resolve("streamux") is streamux
    assert formats.resolve(streamux, SessionConfig()) is streamux  # nothing set: the same object
    resolved = formats.resolve("streamux", SessionConfig(streamux_quick_init="request"))
    assert resolved.options == StreamuxOptions(quick_init="request") and resolved.name == "streamux"
    # A keyword that is set wins over the format object's option; the others stay.
    configured = streamux.configure(early_responses=True, quick_init="allow")
    both = formats.resolve(configured, SessionConfig(streamux_quick_init="request"))
    assert both.options == StreamuxOptions(early_responses=True, quick_init="request")
    assert formats.resolve("yamux", SessionConfig(max_receive_window=1 << 20)).options == YamuxOptions(
        max_receive_window=1 << 20
    )
    with pytest.raises(ValueError, match=r"given as SessionConfig streamux_quick_init\)$"):
        formats.resolve("streamux", SessionConfig(streamux_quick_init="yes"))
    # mstream has no options: another format's keyword is refused, not ignored (issue 40).
    with pytest.raises(ValueError, match=r"^streamux_quick_init is an option of streamux \(StreamuxOptions"):
        formats.resolve("mstream-v3", SessionConfig(streamux_quick_init="request"))


def test_the_api_takes_a_configured_format() -> None:
    assert polymux.PROTOCOLS == tuple(polymux.PROTOCOLS) and polymux.PROTOCOLS != ("yamux",)
    assert hash(polymux.PROTOCOLS) == hash(tuple(polymux.PROTOCOLS))
    assert polymux.PROTOCOLS[:2] == ("mstream-v1", "mstream-v2") and repr(polymux.PROTOCOLS).startswith("(")
    engine = formats.make_engine(formats.get("yamux").configure(window_budget=1 << 20))
    assert engine.options == YamuxOptions(window_budget=1 << 20)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="does not run over a message transport"):
        formats.get("yamux").make_engine(message_mode=True)
    with pytest.raises(ValueError, match="unknown protocol 7"):
        formats.get(7)  # type: ignore[arg-type]
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        formats.Nope  # type: ignore[attr-defined]  # noqa: B018
