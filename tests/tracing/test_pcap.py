"""pcap and pcapng input: files written with dpkt from a real recorded session's chunks
(with reordered, duplicated and overlapping segments, sequence numbers wrapping around)
reassemble into exactly the recorded bytes and decode into the same records."""

from __future__ import annotations

import itertools
from pathlib import Path

import dpkt
import pytest

from polymux.tracing import decode_chunks, read_pcap, read_pcap_bytes

from . import pcaputil
from .conftest import record_session, stream, without_time


@pytest.mark.parametrize(
    ("fmt", "ng", "v6"),
    [("yamux", False, False), ("mstream-v3", True, False), ("mplex", True, True), ("streamux", False, True)],
)
async def test_pcap_decodes_like_the_capture(fmt: str, ng: bool, v6: bool, tmp_path: Path) -> None:
    rec = await record_session(fmt, tmp_path / "cap", sizes=(10, 30_000, 90_001))
    chunks = rec.client.chunks
    path = tmp_path / ("x.pcapng" if ng else "x.pcap")
    pcaputil.write(path, pcaputil.connection(chunks, v6=v6), ng=ng)
    flows = list(read_pcap(path))
    assert len(flows) == 1
    flow = flows[0]
    client, server = (pcaputil.CLIENT6, pcaputil.SERVER6) if v6 else (pcaputil.CLIENT, pcaputil.SERVER)
    fmt_addr = (lambda a: f"[{a[0]}]:{a[1]}") if v6 else (lambda a: f"{a[0]}:{a[1]}")
    assert (flow.client, flow.server) == (fmt_addr(client), fmt_addr(server))
    assert flow.session == f"{flow.client}-{flow.server}"
    assert flow.handshake_seen and flow.gaps == {}
    for direction in ("c2s", "s2c"):
        assert stream(flow.chunks, direction) == stream(chunks, direction)
    expected = without_time(decode_chunks(fmt, chunks, session="s"))
    got = without_time(decode_chunks(fmt, flow.chunks, session="s"))
    # The same records in each direction, in order; across directions the order follows
    # reassembly (the reordered 3rd c2s segment delays what follows it on that side, so
    # two frames that crossed on the wire may swap places, such as both sides' pings).
    for direction in ("c2s", "s2c"):
        assert [r for r in got if r[1] == direction] == [r for r in expected if r[1] == direction]
    assert len(got) == len(expected)
    # Times come from the packets (to the precision the file keeps).
    assert abs(flow.chunks[0][0] - chunks[0][0]) < 10_000
    assert [f.chunks for f in read_pcap_bytes(path.read_bytes())] == [flow.chunks]


async def test_missing_segment_is_a_gap(tmp_path: Path) -> None:
    rec = await record_session("yamux", tmp_path / "cap", sizes=(60_000,))
    chunks = rec.client.chunks
    path = tmp_path / "gap.pcap"
    pcaputil.write(path, pcaputil.connection(chunks, disorder=False, drop_c2s_segment=8))
    (flow,) = read_pcap(path)
    c2s = stream(chunks, "c2s")
    # 8th c2s segment: the segments follow chunk boundaries, so find its start.
    starts = []
    pos = 0
    for _t, d, data in chunks:
        if d == "c2s":
            starts.extend(range(pos, pos + len(data), 1448))
            pos += len(data)
    missing = starts[7]
    assert flow.gaps == {"c2s": missing}
    assert stream(flow.chunks, "c2s") == c2s[:missing]
    assert stream(flow.chunks, "s2c") == stream(chunks, "s2c")


def test_raw_ip_link_type_and_port_reuse(tmp_path: Path) -> None:
    """Two connections on the same addresses one after the other are two flows."""
    from polymux.wire import yamux

    one = [
        (1_000_000, "c2s", yamux.encode_header(2, 1, 0, 1)),
        (2_000_000, "s2c", yamux.encode_header(2, 2, 0, 1)),
    ]
    two = [(9_000_000, "c2s", yamux.encode_header(2, 1, 0, 5))]
    packets = pcaputil.connection(one, linktype=dpkt.pcap.DLT_RAW, disorder=False)
    packets += pcaputil.connection(two, linktype=dpkt.pcap.DLT_RAW, disorder=False, isn=(5, 7))
    path = tmp_path / "raw.pcap"
    pcaputil.write(path, packets, linktype=dpkt.pcap.DLT_RAW)
    flows = list(read_pcap(path))
    assert [f.session for f in flows] == [
        "127.0.0.1:40000-127.0.0.1:9000",
        "127.0.0.1:40000-127.0.0.1:9000#2",
    ]
    assert [[c[1:] for c in f.chunks] for f in flows] == [[c[1:] for c in one], [c[1:] for c in two]]
    records = list(decode_chunks("yamux", flows[1].chunks, session=flows[1].session))
    assert [(r.frame_type, r.ping_id) for r in records] == [("ping", 5)]


def test_not_a_pcap(tmp_path: Path) -> None:
    path = tmp_path / "x.pcap"
    path.write_bytes(b"hello world")
    with pytest.raises(ValueError, match=r"x\.pcap is not a pcap or pcapng file \(first bytes 68656c6c\)"):
        list(read_pcap(path))
    with pytest.raises(OSError):
        list(read_pcap(tmp_path / "missing.pcap"))


def test_the_disorder_is_there() -> None:
    """The packets the tests above read really are out of order, duplicated and
    overlapping, and the client's sequence numbers wrap around."""
    chunks = [(i, "c2s" if i % 3 else "s2c", bytes([i]) * 5000) for i in range(1, 12)]
    seen: dict[int, list[int]] = {40000: [], 9000: []}
    for _t, frame in pcaputil.connection(chunks):
        tcp = dpkt.ethernet.Ethernet(frame).data.data
        if tcp.data:
            seen[tcp.sport].append(tcp.seq)
    c2s, s2c = seen[40000], seen[9000]
    assert any(b < a for a, b in itertools.pairwise(c2s))  # reordered (or wrapped)
    assert len(set(c2s)) < len(c2s)  # a duplicate
    assert min(c2s) < 0x1000 and max(c2s) >= 0xFFFFF000  # wrapped around 2**32
    assert any(b < a + 1448 for a, b in itertools.pairwise(s2c) if b > a)  # an overlap
