"""Format detection from the first bytes of each direction (:func:`polymux.tracing.detect`),
and decoding a flow whose format is detected (:func:`polymux.tracing.decode_flow`: retries,
the window, forced formats)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import polymux
from polymux.tracing import (
    decode_flow,
    detect,
    detect_chunks,
    detect_format,
    forced_format,
    heads,
    parse_protocols,
)
from polymux.wire.mplex import Frame, encode_frame, encode_header

from .conftest import record_session


def _heads(chunks: list[tuple[int, str, bytes]], size: int) -> tuple[bytes, bytes]:
    heads = {"c2s": b"", "s2c": b""}
    for _t, d, data in chunks:
        heads[d] = (heads[d] + data)[:size]
    return heads["c2s"], heads["s2c"]


def _expected(fmt: str) -> str:
    return "mplex" if fmt == "multiplex" else fmt  # the same wire format


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_detects_every_format(fmt: str, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path, sizes=(100, 70_000))
    for size in (64, 256, 100_000):
        c2s, s2c = _heads(rec.client.chunks, size)
        assert detect_format(c2s, s2c) == _expected(fmt), size
        # The client's bytes alone are enough.
        assert detect_format(c2s, b"") == _expected(fmt), size


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_the_detectors_head_decoder_agrees_with_the_frame_decoder(fmt: str, tmp_path: Path) -> None:
    """Detection decodes the heads with polymux.formats.detect.decode_heads (below the
    session layer, so that sessions can name a peer's format); on real heads of every format
    and cut at every size, its records are the FrameDecoder's."""
    from polymux.formats import get
    from polymux.formats.detect import decode_heads
    from polymux.tracing import decode_chunks

    def shape(records: list[polymux.tracing.FrameRecord]) -> list[tuple[object, ...]]:
        return [(r.direction, r.offset, r.channel, r.frame_type, r.length) for r in records]

    rec = await record_session(fmt, tmp_path, sizes=(100, 70_000))
    for size in (5, 12, 64, 256, 4096):
        c2s, s2c = _heads(rec.client.chunks, size)
        for given in ({"c2s": c2s}, {"s2c": s2c}, {"c2s": c2s, "s2c": s2c}):
            chunks = [(0, d, data) for d, data in given.items() if data]
            expected = list(decode_chunks(fmt, chunks, session="detect", one_way=True))
            records, violation = decode_heads(get(fmt), given)
            assert violation is None and not any(r.frame_type == "violation" for r in expected), (size, given)
            assert shape(records) == shape(expected), (size, list(given))


def test_nothing_to_go_on() -> None:
    assert detect_format(b"", b"") is None
    assert detect_format(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 OK\r\n") is None
    assert detect_format(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"") is None  # TLS ClientHello
    rng = random.Random(5)
    hits = sum(detect_format(rng.randbytes(64), rng.randbytes(64)) is not None for _ in range(200))
    assert hits <= 10  # random bytes are rarely taken for anything


# -- the Detection: verdict, evidence, confidence ------------------------------------------


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
async def test_detection_has_a_verdict_evidence_and_confidence(fmt: str, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path, sizes=(100, 70_000))
    d = detect(*heads(rec.client.chunks))
    ambiguous = fmt in ("mplex", "multiplex")  # polymux names its streams: nothing tells
    assert str(d) == ("ambiguous: mplex or multiplex" if ambiguous else fmt)
    assert d.ambiguous is ambiguous
    assert d.format == _expected(fmt) and d.candidates[0] == d.format
    assert 0.5 <= d.confidence <= 1 and d.evidence
    assert d.describe().startswith(
        "ambiguous: mplex or multiplex (decoded as mplex; confidence" if ambiguous else f"detected {fmt} ("
    )
    # The head is cut the same whatever the chunks: a byte at a time gives the same verdict
    # (the pipeline once looked at the first 8 chunks only).
    tiny = [
        (t, direction, data[i : i + 1])
        for t, direction, data in rec.client.chunks[:400]
        for i in range(len(data))
    ]
    assert detect(*heads(tiny)) == d or len(heads(tiny)[0]) < len(heads(rec.client.chunks)[0])
    assert str(detect_chunks(tiny)) == str(d)


def _mplex(*frames: tuple[int, int, bytes]) -> bytes:
    return b"".join(encode_frame(Frame(sid, flag, body)) for sid, flag, body in frames)


def test_libp2p_stream_names_say_mplex() -> None:
    c2s = _mplex((0, 0, b"i0"), (1, 0, b"i1"), (0, 2, b"data"), (1, 2, b"more"))
    d = detect(c2s, _mplex((0, 1, b"echo")))
    assert (str(d), d.ambiguous, d.candidates) == ("mplex", False, ("mplex", "multiplex"))
    assert "NewStream names i0, i1 (@libp2p/mplex's i<id>)" in d.evidence


def test_names_equal_to_the_id_say_mplex() -> None:
    d = detect(_mplex((0, 0, b"0"), (1, 0, b"1"), (0, 2, b"x")), b"")
    assert str(d) == "mplex"
    assert "NewStream names that equal the stream id (multiplex sends none then)" in d.evidence


def test_a_reset_with_a_message_says_multiplex() -> None:
    d = detect(_mplex((0, 0, b"job"), (0, 2, b"x")), _mplex((0, 5, b"boom")))
    assert (str(d), d.candidates) == ("multiplex", ("multiplex", "mplex"))
    assert "a reset carrying a message" in d.evidence


def test_a_frame_over_1_mib_says_multiplex() -> None:
    c2s = _mplex((0, 0, b"big")) + encode_header(0, 2, 3 * 1024 * 1024) + b"x" * 1000
    d = detect(c2s, b"")
    assert str(d) == "multiplex"
    assert "a frame longer than mplex's 1 MiB" in d.evidence


def test_contradicting_hints_stay_ambiguous() -> None:
    d = detect(_mplex((0, 0, b"i0"), (0, 2, b"x")), _mplex((0, 5, b"boom")))
    assert str(d) == "ambiguous: mplex or multiplex"
    assert "contradicting hints" in d.evidence


def test_unknown_bytes() -> None:
    d = detect(b"GET / HTTP/1.1\r\n\r\n", b"")
    assert (d.format, str(d), d.candidates, d.confidence) == (None, "unknown", (), 0.0)
    assert d.describe() == "not recognised (no format fits the first bytes (47 45 54 20 2f 20 48 54 ...))"
    assert detect(b"", b"").evidence == "no bytes"


# -- decode_flow: retry, window, forcing --------------------------------------------------------


def _multiplex_flow(small: int, big: int) -> list[tuple[int, str, bytes]]:
    """A multiplex connection: a stream, ``small`` small messages, one ``big``-byte message."""
    c2s = _mplex((0, 0, b"job"), *[(0, 2, b"m" * 100)] * small)
    c2s += encode_header(0, 2, big) + b"B" * big + _mplex((0, 4, b""))
    return [(1, "c2s", c2s)]


def test_a_detected_format_that_fails_early_is_retried() -> None:
    flow = decode_flow(_multiplex_flow(50, 2 * 1024 * 1024), session="s")
    records = list(flow.records)
    assert flow.format == "multiplex"
    assert flow.how.startswith("ambiguous: mplex or multiplex (decoded as multiplex; confidence ")
    assert (
        "; as mplex it fails at c2s offset 5105 (mplex: frame length 2097152 of stream 0 exceeds" in flow.how
    )
    assert not [r for r in records if r.frame_type in ("violation", "truncated")]
    assert sum(r.length for r in records if r.frame_type == "data") == 50 * 100 + 2 * 1024 * 1024
    assert {r.format for r in records} == {"multiplex"}


def test_a_failure_after_the_window_is_reported_not_retried() -> None:
    flow = decode_flow(_multiplex_flow(50, 2 * 1024 * 1024), session="s", window=10)
    records = list(flow.records)
    assert flow.format == "mplex"
    assert " it fails at " not in flow.how
    [violation] = [r for r in records if r.frame_type == "violation"]
    assert violation.offset == 5105 and "exceeds the maximum message size 1048576" in str(violation.error)


def test_when_every_candidate_fails_the_one_that_got_furthest_is_kept() -> None:
    # flag 7, which neither knows, after the first 4,096 bytes the detector reads
    c2s = _mplex((0, 0, b"job"), (0, 2, b"x" * 5000)) + bytes([7])
    flow = decode_flow([(1, "c2s", c2s)], session="s")
    records = list(flow.records)
    assert flow.format == "mplex"
    assert flow.how.endswith("decoded as mplex, which got furthest")
    assert "as mplex it fails at c2s offset 5008" in flow.how
    assert "as multiplex it fails at c2s offset 5008" in flow.how
    assert [r.frame_type for r in records][-1] == "violation"


def test_a_given_format_is_not_retried() -> None:
    flow = decode_flow(
        _multiplex_flow(5, 2 * 1024 * 1024), session="s", format="mplex", how="forced (--protocol)"
    )
    assert (flow.format, flow.how, flow.detection) == ("mplex", "forced (--protocol)", None)
    assert [r.frame_type for r in flow.records if r.frame_type == "violation"] == ["violation"]


def test_unrecognised_flow_has_no_records() -> None:
    flow = decode_flow([(1, "c2s", b"SSH-2.0-OpenSSH_9.6\r\n")], session="s")
    assert flow.format is None and list(flow.records) == []
    assert flow.how.startswith("not recognised (no format fits the first bytes")


def test_forced_format_and_parse_protocols() -> None:
    assert parse_protocols(None) is None and parse_protocols([]) is None
    assert parse_protocols(["yamux"]) == {"*": "yamux"}
    choice = parse_protocols(["multiplex", "*:9000=yamux", "10.0.0.1:*=mplex"])
    assert choice == {"*:9000": "yamux", "10.0.0.1:*": "mplex", "*": "multiplex"}
    assert list(choice) == ["*:9000", "10.0.0.1:*", "*"]  # patterns first, the default last
    assert forced_format("127.0.0.1:4000-127.0.0.1:9000", choice) == "yamux"
    assert forced_format("10.0.0.1:4000-127.0.0.1:80", choice) == "mplex"
    assert forced_format("127.0.0.1:4000-127.0.0.1:80", choice) == "multiplex"
    assert forced_format("x", {"*:9000": "yamux"}) is None
    assert forced_format("x", "yamux") == "yamux" and forced_format("x", None) is None
    with pytest.raises(ValueError, match=r"unknown format 'yamx' in --protocol '\*=yamx'; polymux decodes: "):
        parse_protocols(["*=yamx"])
    with pytest.raises(ValueError, match="give one format for every flow, or FLOW=FORMAT"):
        parse_protocols(["yamux", "mplex"])
    with pytest.raises(ValueError, match="the flow pattern before '=' is empty"):
        parse_protocols(["=yamux"])
