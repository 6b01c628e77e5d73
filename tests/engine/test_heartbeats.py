"""Heartbeats of the formats without pings (``Engine.heartbeat``): the exact frame each
sends, that the peer's engine counts it (``peer_heartbeats``) and does nothing else with it
(no event, no answer); formats whose pings are answered send none; smux's is a NOP, and
the peer's NOPs count as its pings, which the session measures."""

from __future__ import annotations

import pytest

from polymux import PROTOCOLS
from polymux._types import BytesLike
from polymux.engine.base import Engine
from polymux.engine.mplex import HEARTBEAT_STREAM
from polymux.engine.mstream import HEARTBEAT_CODE
from polymux.engine.omnistreams import OmnistreamsEngine
from polymux.formats import make_engine
from polymux.wire import mplex as mwire, mstream as swire, smux as smwire


PINGLESS = (
    "mstream-v1",
    "mstream-v2",
    "mstream-v3",
    "mplex",
    "multiplex",
    "omnistreams",
    "omnistreams-legacy",
)


def _joined(chunks: list[BytesLike]) -> bytes:
    return b"".join(bytes(c) for c in chunks)


def _ready_pair(name: str) -> tuple[Engine, Engine]:
    a, b = make_engine(name, is_client=True), make_engine(name, is_client=False)
    for _ in range(3):  # handshakes both ways
        b.receive_data(_joined(a.data_to_send()))
        a.receive_data(_joined(b.data_to_send()))
    return a, b


@pytest.mark.parametrize("name", PINGLESS)
def test_a_heartbeat_is_counted_by_the_peer_and_changes_nothing_else(name: str) -> None:
    a, b = _ready_pair(name)
    assert a.heartbeat() is True
    sent = _joined(a.data_to_send())
    assert sent
    assert b.receive_data(sent + sent) == []
    assert b.peer_heartbeats == 2
    assert b.data_to_send() == []  # no answer
    assert not b.closed


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (1, bytes((HEARTBEAT_CODE, 0, 0, 0, 0, 0, 0))),  # code, channel id 0, no payload
        (2, b"\x91" + bytes((HEARTBEAT_CODE,))),  # [code]
        (3, b"\x91" + bytes((HEARTBEAT_CODE,))),
    ],
)
def test_mstream_heartbeat_is_an_unknown_code_without_a_channel(version: int, expected: bytes) -> None:
    a, _b = _ready_pair(f"mstream-v{version}")
    a.heartbeat()
    assert _joined(a.data_to_send()) == expected
    (frame,) = swire.Decoder(version, handshake=False).feed(expected)
    assert frame == swire.Frame(HEARTBEAT_CODE, 0 if version == 1 else None)


def test_other_unknown_mstream_codes_are_ignored_and_not_counted() -> None:
    _a, b = _ready_pair("mstream-v3")
    assert b.receive_data(swire.encode_header(3, HEARTBEAT_CODE + 1, None, 0)) == []
    assert b.peer_heartbeats == 0


@pytest.mark.parametrize("name", ["mplex", "multiplex"])
def test_mplex_heartbeat_resets_a_stream_of_ours_never_opened(name: str) -> None:
    a, b = _ready_pair(name)
    a.heartbeat()
    sent = _joined(a.data_to_send())
    assert sent == mwire.encode_header(HEARTBEAT_STREAM, mwire.Flag.RESET_INITIATOR, 0)
    # Other resets of unknown streams are ignored, and not counted.
    other = mwire.encode_header(HEARTBEAT_STREAM, mwire.Flag.RESET_RECEIVER, 0)
    other += mwire.encode_header(7, mwire.Flag.RESET_INITIATOR, 0)
    assert b.receive_data(other) == []
    assert b.peer_heartbeats == 0


def test_omnistreams_heartbeat_is_a_request_for_nothing_and_none_over_messages() -> None:
    a = OmnistreamsEngine()
    assert a.heartbeat()
    assert _joined(a.data_to_send()) == b"\x00\x00\x00\x03\x05\x00\x00"  # length 3: REQUEST_DATA 0, 0
    ws = OmnistreamsEngine(message_mode=True)
    assert ws.heartbeat() is False  # a WebSocket pings by itself
    assert ws.data_to_send() == []


@pytest.mark.parametrize("name", [p for p in PROTOCOLS if p not in PINGLESS and not p.startswith("smux")])
def test_formats_whose_pings_are_answered_send_no_heartbeat(name: str) -> None:
    engine = make_engine(name)
    engine.data_to_send()
    assert engine.heartbeat() is False
    assert engine.data_to_send() == []


@pytest.mark.parametrize("version", [1, 2])
def test_smux_heartbeat_is_a_nop_and_the_peers_nops_count_as_its_pings(version: int) -> None:
    name = "smux" if version == 1 else "smux-v2"
    a, b = _ready_pair(name)
    assert a.heartbeat() is True
    assert _joined(a.data_to_send()) == smwire.encode_header(version, smwire.Cmd.NOP, 0, 0)
    b.receive_data(smwire.encode_header(version, smwire.Cmd.NOP, 0, 0) * 2)
    assert b.peer_pings == 2
