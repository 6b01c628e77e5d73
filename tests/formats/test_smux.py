"""smux's frame-record walk and signature (:mod:`polymux.formats.smux`): the walk decodes
with the format's own version and gives one record per frame; the signature tells the
versions apart from their first bytes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from polymux.exceptions import ProtocolError
from polymux.formats import smux
from polymux.formats.signature import Fit
from polymux.wire.smux import Cmd, Decoder, Frame


def h(text: str) -> bytes:
    """Hex (spaces allowed) to bytes."""
    return bytes.fromhex(text)


def norm(frames: list[Frame]) -> list[Frame]:
    """Frames with their (memoryview) bodies turned into bytes."""
    return [f._replace(body=bytes(f.body)) for f in frames]


@dataclass
class Host:
    """What a walk needs of its decoder."""

    format: str
    session: str = "s"
    one_way: bool = False
    released: list[str] = field(default_factory=list)

    def release(self, direction: str) -> None:
        self.released.append(direction)


def walk(fmt: str) -> smux.SmuxWalk:
    made = (smux.SMUX if fmt == "smux" else smux.SMUX_V2).walk(Host(fmt))
    assert isinstance(made, smux.SmuxWalk)
    return made


def test_the_walk_decodes_with_the_formats_version() -> None:
    psh2 = h("02 02 0200 03000000 6869")
    assert norm(walk("smux-v2").codec("c2s").feed(psh2)) == [Frame(Cmd.PSH, 3, b"hi")]
    with pytest.raises(ProtocolError, match="version is 2, expected 1") as info:
        walk("smux").codec("c2s").feed(psh2)
    assert info.value.format == "smux"


def test_the_walk_s_frame_fields() -> None:
    # (size on the wire, stream id, type, length, flags): a NOP belongs to no stream, a
    # UPD's length is the window it announces (not its 8-byte body).
    w = walk("smux")
    assert w.frame(Frame(Cmd.PSH, 3, b"hello")) == (13, 3, "data", 5, Cmd.PSH)
    assert w.frame(Frame(Cmd.SYN, 3)) == (8, 3, "open", 0, Cmd.SYN)
    assert w.frame(Frame(Cmd.FIN, 5)) == (8, 5, "end", 0, Cmd.FIN)
    assert w.frame(Frame(Cmd.NOP, 0)) == (8, None, "ping", 0, Cmd.NOP)
    [upd] = Decoder(2).feed(h("02 04 0800 03000000 10000000 00000400"))
    assert walk("smux-v2").frame(upd) == (16, 3, "window_update", 0x40000, Cmd.UPD)
    assert w.size(Frame(Cmd.PSH, 3, b"hello")) == 13
    assert bytes(w.payload(Frame(Cmd.PSH, 3, b"hello"))) == b"hello"
    [record] = w.records("c2s", Frame(Cmd.NOP, 0), 8, 1)
    assert (record.channel, record.frame_type, record.offset, record.time_ns) == ("", "ping", 8, 1)


@dataclass
class Probe:
    """The heads, as a signature sees them (smux's reads them itself)."""

    c2s: bytes
    s2c: bytes

    @property
    def heads(self) -> dict[str, bytes]:
        return {"c2s": self.c2s, "s2c": self.s2c}

    def decode(self, fmt: object) -> None:
        raise AssertionError("smux's signature decodes the heads itself")


SYN3 = "01 00 0000 03000000"
PSH3 = "01 02 0200 03000000 6869"
NOP = "01 03 0000 00000000"
KEEPALIVE = ", the first a NOP on stream 0 (its 8 bytes all fixed: smux's keepalive)"


@pytest.mark.parametrize(
    ("fmt", "c2s", "s2c", "expected"),
    [
        ("smux", SYN3, "", (0.6, "1 smux version 1 frame (8-byte headers)")),
        ("smux", NOP, "", (0.95, f"1 smux version 1 frame (8-byte headers){KEEPALIVE}")),
        ("smux", "", NOP, (0.95, f"1 smux version 1 frame (8-byte headers){KEEPALIVE}")),
        ("smux", SYN3 + PSH3, PSH3, (0.8, "3 smux version 1 frames (8-byte headers)")),
        ("smux", "", PSH3, (0.6, "1 smux version 1 frame (8-byte headers)")),  # any first server frame
        ("smux", SYN3 * 9, "", (0.95, "9 smux version 1 frames (8-byte headers)")),  # confidence capped
        ("smux-v2", "02 00 0000 03000000", "", (0.6, "1 smux version 2 frame (8-byte headers)")),
        ("smux", PSH3, "", None),  # a client starts by opening a stream or with a NOP
        ("smux-v2", SYN3, "", None),  # the other protocol version
        ("smux", SYN3, "02 02 0200 03000000 6869", None),
        ("smux", "01 07 0000 03000000", "", None),  # not a frame (unknown cmd)
        ("smux", "01 00 00", "", None),  # no whole frame yet
        ("smux", "", "", None),
    ],
)
def test_signature(fmt: str, c2s: str, s2c: str, expected: tuple[float, str] | None) -> None:
    signature = (smux.SMUX if fmt == "smux" else smux.SMUX_V2).signature
    assert signature is not None and not signature.handshake
    got = signature.fits(Probe(h(c2s), h(s2c)))  # type: ignore[arg-type]
    if expected is None:
        assert got == []
    else:
        [fit] = got
        assert isinstance(fit, Fit) and fit.format == fmt
        assert fit.confidence == pytest.approx(expected[0]) and fit.evidence == expected[1]
