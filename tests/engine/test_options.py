"""Typed format options and capabilities (:mod:`polymux.engine.spec`): each format's own
settings validate on construction, the SessionConfig keywords older releases had for them
still set them (and a bad value names the keyword as it was given), and every engine's
flags are read from its one :class:`~polymux.engine.spec.Capabilities` declaration."""

from __future__ import annotations

from typing import Any

import pytest

from polymux.config import SessionConfig
from polymux.engine.mplex import MplexEngine
from polymux.engine.mstream import MStreamEngine
from polymux.engine.omnistreams import OmnistreamsEngine
from polymux.engine.smux import SmuxEngine, SmuxOptions
from polymux.engine.spec import Capabilities, NoOptions
from polymux.engine.streamux import StreamuxEngine, StreamuxOptions
from polymux.engine.yamux import YamuxEngine, YamuxOptions


def test_options_without_compatibility_keywords_are_unchanged_by_a_config() -> None:
    options = NoOptions()
    assert options.merged(None) is options
    assert options.merged(SessionConfig(streamux_quick_init="request")) is options


def test_a_compatibility_keyword_sets_its_option() -> None:
    options = StreamuxOptions()
    assert options.merged(None) is options
    assert options.merged(SessionConfig()) is options  # none set: the same object
    merged = options.merged(SessionConfig(streamux_quick_init="request", streamux_id_bits=(1, 8, 8)))
    assert merged == StreamuxOptions(quick_init="request", id_bits=(1, 8, 8))
    assert YamuxOptions().merged(SessionConfig(window_budget=1 << 20)).window_budget == 1 << 20
    assert SmuxOptions().merged(SessionConfig(smux_peer_buffer=1 << 20)).peer_buffer == 1 << 20


def test_a_bad_compatibility_value_names_the_keyword_given() -> None:
    with pytest.raises(ValueError, match=r"^YamuxOptions.window_budget must be a positive int, got 0 "):
        YamuxOptions().merged(SessionConfig(window_budget=0))
    with pytest.raises(ValueError, match=r"\(given as SessionConfig window_budget\)$"):
        YamuxOptions().merged(SessionConfig(window_budget=0))


@pytest.mark.parametrize(
    ("cls", "options", "message"),
    [
        (YamuxOptions, {"max_receive_window": 0}, "YamuxOptions.max_receive_window must be a positive int"),
        (YamuxOptions, {"window_budget": "1"}, "YamuxOptions.window_budget must be a positive int"),
        (SmuxOptions, {"peer_buffer": -1}, "SmuxOptions.peer_buffer must be a positive int"),
        (SmuxOptions, {"peer_buffer": 1.5}, "SmuxOptions.peer_buffer must be a positive int"),
        (StreamuxOptions, {"early_responses": "no"}, "early_responses must be a bool, got .no."),
        (StreamuxOptions, {"quick_init": "on"}, "quick_init must be 'off', 'request' or 'allow', got 'on'"),
        (StreamuxOptions, {"response_hold": 0}, "StreamuxOptions.response_hold must be a positive int"),
        (StreamuxOptions, {"hold_budget": "x"}, "StreamuxOptions.hold_budget must be a positive int"),
        (
            StreamuxOptions,
            {"response_hold": 200, "hold_budget": 100},
            r"hold_budget \(100\) must be at least response_hold \(200\)",
        ),
        (StreamuxOptions, {"id_bits": (5, 3, 4)}, "invalid streamux settings"),
    ],
)
def test_options_validate_on_construction(cls: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls(**options)


def test_engines_take_typed_options() -> None:
    assert YamuxEngine(options=YamuxOptions(max_receive_window=1 << 20)).options.max_receive_window == 1 << 20
    assert SmuxEngine(2, options=SmuxOptions(peer_buffer=1 << 20)).options.peer_buffer == 1 << 20
    streamux = StreamuxEngine(options=StreamuxOptions(quick_init="request"))
    assert streamux.ours.quick_request
    # Without options: the defaults, with what the config sets of the compatibility keywords.
    assert YamuxEngine(SessionConfig(max_receive_window=1 << 21)).options.max_receive_window == 1 << 21
    assert StreamuxEngine().options == StreamuxOptions()


@pytest.mark.parametrize(
    "engine",
    [
        MStreamEngine(1),
        MStreamEngine(2),
        MStreamEngine(3),
        MplexEngine("mplex"),
        MplexEngine("multiplex"),
        YamuxEngine(),
        StreamuxEngine(),
        OmnistreamsEngine(),
        SmuxEngine(1),
        SmuxEngine(2),
    ],
    ids=lambda e: e.format,
)
def test_an_engine_s_flags_are_its_capabilities(engine: Any) -> None:
    caps = engine.caps
    assert isinstance(caps, Capabilities)
    assert engine.has_flow_control == (caps.credit is not None)
    assert engine.has_ping == caps.ping
    assert engine.one_way == caps.one_way
    assert engine.needs_acceptance == caps.acceptance
    assert engine.open_acknowledged == caps.open_acknowledged
    assert engine.ping_answered == caps.ping_answered
    assert engine.has_controls == caps.controls
