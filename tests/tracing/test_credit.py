"""Credit tracking against sessions built by hand with the wire encoders, where every
value is computed here from the format's rules."""

from __future__ import annotations

from polymux.tracing import FrameRecord, decode_chunks
from polymux.wire import mstream, yamux
from polymux.wire.yamux import Flag, Type


def _decode(fmt: str, chunks: list[tuple[int, str, bytes]]) -> list[FrameRecord]:
    return list(decode_chunks(fmt, chunks, session="hand"))


def _view(records: list[FrameRecord]) -> list[tuple[object, ...]]:
    return [
        (r.direction, r.offset, r.channel, r.frame_type, r.length, r.credit, r.credit_dir) for r in records
    ]


def test_yamux_credit_by_hand() -> None:
    h = yamux.encode_header
    w = yamux.INITIAL_WINDOW  # 262144
    chunks = [
        (1, "c2s", h(Type.PING, Flag.SYN, 0, 7)),
        (2, "c2s", h(Type.WINDOW_UPDATE, Flag.SYN, 1, 0)),  # open, no extra window
        (3, "s2c", h(Type.PING, Flag.ACK, 0, 7) + h(Type.WINDOW_UPDATE, Flag.ACK, 1, 1000)),
        (4, "c2s", h(Type.DATA, 0, 1, 100_000) + bytes(100_000)),
        (5, "c2s", h(Type.DATA, 0, 1, 163_144) + bytes(163_144)),  # exactly the rest
        (6, "s2c", h(Type.WINDOW_UPDATE, 0, 1, 131_072)),
        (7, "c2s", h(Type.DATA, 0, 1, 1000) + bytes(1000)),
        (8, "s2c", h(Type.DATA, Flag.FIN, 1, 500) + bytes(500)),
        (9, "c2s", h(Type.WINDOW_UPDATE, Flag.FIN, 1, 500)),
        (10, "c2s", h(Type.GO_AWAY, 0, 0, 1)),
    ]
    records = _decode("yamux", chunks)
    assert _view(records) == [
        ("c2s", 0, "", "ping", 0, None, ""),
        ("c2s", 12, "1", "open", 0, w, "s2c"),
        ("s2c", 0, "", "pong", 0, None, ""),
        ("s2c", 12, "1", "open_ack", 1000, w + 1000, "c2s"),
        ("c2s", 24, "1", "data", 100_000, w + 1000 - 100_000, "c2s"),
        ("c2s", 100_036, "1", "data", 163_144, 0, "c2s"),
        ("s2c", 24, "1", "window_update", 131_072, 131_072, "c2s"),
        ("c2s", 263_192, "1", "data", 1000, 130_072, "c2s"),
        ("s2c", 36, "1", "data", 500, w - 500, "s2c"),
        ("s2c", 36, "1", "end", 0, None, ""),
        ("c2s", 264_204, "1", "window_update", 500, w, "s2c"),
        ("c2s", 264_204, "1", "end", 0, None, ""),
        ("c2s", 264_216, "", "go_away", 0, None, ""),
    ]
    assert records[0].ping_id == records[2].ping_id == 7
    assert records[-1].error == "go away code 1 (protocol error)"
    assert records[5].flags == 0 and records[9].flags == Flag.FIN


def test_yamux_overrun_is_a_violation() -> None:
    h = yamux.encode_header
    chunks = [
        (1, "c2s", h(Type.DATA, Flag.SYN, 3, 200_000) + bytes(200_000)),
        (2, "c2s", h(Type.DATA, 0, 3, 70_000) + bytes(70_000)),  # 262144 - 200000 = 62144 left
        (3, "c2s", h(Type.DATA, 0, 3, 10) + bytes(10)),
        (4, "s2c", h(Type.DATA, Flag.ACK, 3, 5) + bytes(5)),
    ]
    records = _decode("yamux", chunks)
    assert _view(records) == [
        ("c2s", 0, "3", "open", 0, None, ""),
        ("c2s", 0, "3", "data", 200_000, 62_144, "c2s"),
        ("c2s", 200_012, "", "violation", 0, None, ""),
        ("s2c", 0, "3", "open_ack", 0, None, ""),
        ("s2c", 0, "3", "data", 5, yamux.INITIAL_WINDOW - 5, "s2c"),
    ]
    assert records[2].error == "yamux: stream 3 overran its send window: 70000 bytes with 62144 left"


def test_mstream_v2_credit_by_hand() -> None:
    v = 2
    hs = mstream.encode_handshake

    def frame(code: int, cid: int | None, payload: bytes = b"") -> bytes:
        return mstream.encode_frame(v, mstream.Frame(code, cid, payload))

    C = mstream.ControlCode
    offer = frame(C.OFFER, 1, mstream.encode_offer(v, "a", 50_000))
    accept = frame(C.OFFER_ACCEPTED, 1, mstream.encode_offer_accepted(v, 30_000))
    content1 = frame(C.CONTENT, 1, bytes(20_480))
    content2 = frame(C.CONTENT, 1, bytes(9_520))
    processed = frame(C.CONTENT_PROCESSED, 1, mstream.encode_content_processed(20_480))
    adjust = frame(C.CHANNEL_WINDOW_ADJUST, 1, mstream.encode_window_adjust(40_000))
    back = frame(C.CONTENT, 1, bytes(1000))
    over_ack = frame(C.CONTENT_PROCESSED, 1, mstream.encode_content_processed(2000))
    chunks = [
        (1, "c2s", hs(2, bytes(16)) + offer),
        (2, "s2c", hs(2, b"\x01" * 16) + accept),
        (3, "c2s", content1 + content2),
        (4, "s2c", processed + adjust + back),
        (5, "c2s", over_ack),
        (6, "c2s", content1),  # after the violation: not decoded
    ]
    records = _decode("mstream-v2", chunks)
    c_off = 22 + len(offer)
    s_off = 22 + len(accept)
    assert _view(records) == [
        ("c2s", 0, "", "handshake", 0, None, ""),
        ("c2s", 22, "1", "open", len(mstream.encode_offer(v, "a", 50_000)), 50_000, "s2c"),
        ("s2c", 0, "", "handshake", 0, None, ""),
        ("s2c", 22, "1", "open_ack", len(mstream.encode_offer_accepted(v, 30_000)), 30_000, "c2s"),
        ("c2s", c_off, "1", "data", 20_480, 9_520, "c2s"),
        ("c2s", c_off + len(content1), "1", "data", 9_520, 0, "c2s"),
        ("s2c", s_off, "1", "window_update", 20_480, 20_480, "c2s"),
        ("s2c", s_off + len(processed), "1", "window_update", 10_000, 30_480, "c2s"),
        ("s2c", s_off + len(processed) + len(adjust), "1", "data", 1000, 49_000, "s2c"),
        ("c2s", c_off + len(content1) + len(content2), "", "violation", 0, None, ""),
    ]
    assert records[-1].error == (
        "mstream-v2: channel 1: ContentProcessed acknowledges 2000 bytes, but only 1000 are in flight"
    )


def test_mstream_v2_default_window_and_early_content() -> None:
    """An Offer without a window grants the reference's 102,400 bytes; Content before the
    OfferAccepted overruns a window of 0."""
    v = 2
    C = mstream.ControlCode

    def frame(code: int, cid: int | None, payload: bytes = b"") -> bytes:
        return mstream.encode_frame(v, mstream.Frame(code, cid, payload))

    offer = frame(C.OFFER, 2, mstream.encode_offer(v, "b", None))
    early = frame(C.CONTENT, 2, b"xyz")
    records = _decode("mstream-v2", [(1, "s2c", mstream.encode_handshake(2, bytes(16)) + offer + early)])
    assert _view(records)[1] == (
        "s2c",
        22,
        "2",
        "open",
        len(mstream.encode_offer(v, "b", None)),
        102_400,
        "c2s",
    )
    assert records[2].frame_type == "violation" and records[2].offset == 22 + len(offer)
    assert "overran the send window" in (records[2].error or "")


def test_no_credit_formats_and_one_way() -> None:
    from polymux.wire import mplex

    data = mplex.encode_frame(mplex.Frame(0, 0, b"n")) + mplex.encode_frame(mplex.Frame(0, 2, b"hello"))
    records = _decode("mplex", [(1, "c2s", data)])
    assert [(r.channel, r.frame_type, r.length, r.credit) for r in records] == [
        ("c0", "open", 1, None),
        ("c0", "data", 5, None),
    ]
    # one_way: credit is not tracked, so Content without the peer's acceptance is fine.
    v = 3
    C = mstream.ControlCode
    frames = mstream.encode_frame(v, mstream.Frame(C.OFFER, 1, mstream.encode_offer(v, "x", 10), 1))
    frames += mstream.encode_frame(v, mstream.Frame(C.CONTENT, 1, bytes(50), 1))
    one = list(decode_chunks("mstream-v3", [(0, "c2s", frames)], session="x", one_way=True))
    assert [(r.channel, r.frame_type, r.credit, r.credit_dir) for r in one] == [
        ("c1", "open", None, ""),
        ("c1", "data", None, ""),
    ]
