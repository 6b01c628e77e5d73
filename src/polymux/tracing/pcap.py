"""TCP flows from pcap and pcapng files (tcpdump, tshark, dumpcap), as capture chunks.

The container formats and the Ethernet / Linux cooked / loopback / raw IP, IPv4, IPv6 and
TCP headers are parsed by `dpkt <https://github.com/kbandla/dpkt>`_; this module only
reassembles each TCP direction by sequence number: retransmitted and overlapping bytes are
taken once, out-of-order segments are held until the gap before them fills (at most
``MAX_OUT_OF_ORDER`` bytes per direction), and a gap that never fills (packets the capture
missed, or a snap length that cut payloads) ends that direction's data there (``Flow.gaps``).

The side that sent the SYN (without ACK) is the client; in a capture that starts after the
handshake, the side with the higher port is taken to be the client.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from polymux._extras import require
from polymux.tracing.records import C2S, S2C, Chunk


__all__ = ["MAX_OUT_OF_ORDER", "Flow", "read_pcap", "read_pcap_bytes"]

MAX_OUT_OF_ORDER = 64 * 1024 * 1024
"""Bytes of out-of-order segments held per direction; beyond it the gap is given up."""

_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1",
    b"\xa1\xb2\xc3\xd4",
    b"\x4d\x3c\xb2\xa1",
    b"\xa1\xb2\x3c\x4d",
}
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"

_FIN, _SYN, _RST, _ACK = 0x01, 0x02, 0x04, 0x10
_LINKTYPES = (0, 1, 12, 14, 101, 108, 113, 228, 229, 276)


@dataclass
class Flow:
    """One TCP connection: both directions' payload bytes, reassembled, as chunks."""

    session: str
    """``"<client>-<server>"`` addresses, e.g. ``"127.0.0.1:40000-127.0.0.1:9000"`` (with
    ``#2`` ... appended when the same addresses carry another connection later)."""
    client: str
    """The client's ``address:port`` (``[v6 address]:port`` for IPv6)."""
    server: str
    """The server's address."""
    chunks: list[Chunk] = field(default_factory=list)
    """``(time_ns, direction, data)`` in capture order; each direction's data is its
    contiguous byte stream from the first byte after the SYN."""
    gaps: dict[str, int] = field(default_factory=dict)
    """Direction -> stream offset where bytes are missing from the capture (nothing after
    it is in :attr:`chunks`)."""
    handshake_seen: bool = False
    """Whether the capture has the connection's SYN (else it started mid-connection)."""


class _Half:
    """One direction's reassembly state."""

    __slots__ = ("base", "closed", "gap", "held", "next", "ooo")

    def __init__(self) -> None:
        self.base: int | None = None  # absolute (unwrapped) sequence number of stream offset 0
        self.next = 0  # absolute sequence number of the next byte expected
        self.ooo: dict[int, bytes] = {}  # absolute start -> data, waiting for the gap to fill
        self.held = 0
        self.gap: int | None = None
        self.closed = False

    def unwrap(self, seq: int) -> int:
        diff = (seq - self.next) & 0xFFFFFFFF
        if diff >= 0x80000000:
            diff -= 0x100000000
        return self.next + diff


class _Conn:
    def __init__(self, a: tuple[str, int], b: tuple[str, int], client: tuple[str, int] | None) -> None:
        self.ends = (a, b)
        self.client = client
        self.halves: dict[tuple[str, int], _Half] = {a: _Half(), b: _Half()}
        self.chunks: list[tuple[int, tuple[str, int], bytes]] = []
        self.handshake_seen = client is not None
        self.reset = False

    def finished(self) -> bool:
        return self.reset or all(h.closed for h in self.halves.values())


def _dpkt() -> Any:
    """The dpkt module (untyped; imported on first use; the pcap extra)."""
    return require("dpkt", "reading pcap and pcapng files")


def _addr(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _ip_text(raw: bytes) -> str:
    import socket

    return socket.inet_ntop(socket.AF_INET6 if len(raw) == 16 else socket.AF_INET, raw)


def _network_layer(linktype: int, buf: bytes) -> Any:
    """The IP packet in a link-layer frame, or None."""
    dpkt = _dpkt()

    if linktype == 1:  # Ethernet
        return dpkt.ethernet.Ethernet(buf).data
    if linktype == 113:  # Linux cooked
        return dpkt.sll.SLL(buf).data
    if linktype == 276:  # Linux cooked v2
        return dpkt.sll2.SLL2(buf).data
    if linktype in (0, 108):  # BSD loopback / OpenBSD loop
        return dpkt.loopback.Loopback(buf).data
    if not buf:  # raw IP
        return None
    return dpkt.ip6.IP6(buf) if buf[0] >> 4 == 6 else dpkt.ip.IP(buf)


def _packets(stream: BinaryIO, name: str) -> Iterator[tuple[int, Any]]:
    """``(time_ns, IP packet)`` for every IP packet in a pcap or pcapng stream."""
    dpkt = _dpkt()

    head = stream.read(4)
    stream.seek(0)
    reader: Any
    try:
        if head in _PCAP_MAGICS:
            reader = dpkt.pcap.Reader(stream)
        elif head == _PCAPNG_MAGIC:
            reader = dpkt.pcapng.Reader(stream)
        else:
            raise ValueError(f"{name} is not a pcap or pcapng file (first bytes {head.hex() or 'none'})")
    except (dpkt.UnpackError, ValueError, struct.error) as exc:
        if isinstance(exc, ValueError) and str(exc).startswith(name):
            raise
        raise ValueError(f"{name}: cannot read the capture header: {exc}") from None
    linktype = reader.datalink()
    if linktype not in _LINKTYPES:
        raise ValueError(
            f"{name}: unsupported link type {linktype} (Ethernet, Linux cooked, loopback and raw IP are read)"
        )
    iterator = iter(reader)
    while True:
        try:
            ts, buf = next(iterator)
        except StopIteration:
            return
        except (dpkt.UnpackError, struct.error, ValueError):
            return  # a truncated file: what came before is still good
        try:
            packet = _network_layer(linktype, buf)
        except (dpkt.UnpackError, struct.error, ValueError, IndexError):
            continue
        if packet is None:
            continue
        if isinstance(ts, float):
            time_ns = round(ts * 1e9)
        else:  # Decimal (nanosecond pcap)
            time_ns = int(ts * 1_000_000_000)
        yield time_ns, packet


def _flows(stream: BinaryIO, name: str) -> Iterator[Flow]:
    dpkt = _dpkt()

    conns: dict[frozenset[tuple[str, int]], _Conn] = {}
    used: dict[str, int] = {}

    def finish(conn: _Conn) -> Flow | None:
        for half in conn.halves.values():
            if half.ooo and half.gap is None and half.base is not None:
                half.gap = half.next - half.base
        if not conn.chunks:
            return None
        client = conn.client
        if client is None:  # no handshake in the capture: the higher port is the client
            a, b = conn.ends
            client = a if a[1] > b[1] else b
        server = conn.ends[1] if client == conn.ends[0] else conn.ends[0]
        session = f"{_addr(*client)}-{_addr(*server)}"
        n = used.get(session, 0) + 1
        used[session] = n
        if n > 1:
            session = f"{session}#{n}"
        flow = Flow(session, _addr(*client), _addr(*server), handshake_seen=conn.handshake_seen)
        flow.chunks = [(t, C2S if src == client else S2C, data) for t, src, data in conn.chunks]
        for end, half in conn.halves.items():
            if half.gap is not None:
                flow.gaps[C2S if end == client else S2C] = half.gap
        return flow

    for time_ns, ip in _packets(stream, name):
        tcp = ip.data
        if not isinstance(tcp, dpkt.tcp.TCP):
            continue
        try:
            src = (_ip_text(ip.src), tcp.sport)
            dst = (_ip_text(ip.dst), tcp.dport)
        except (ValueError, OSError):
            continue
        key = frozenset((src, dst))
        flags = tcp.flags
        conn = conns.get(key)
        syn = flags & _SYN and not flags & _ACK
        if conn is not None and syn and (conn.finished() or conn.chunks):
            # A new connection on the same addresses (a SYN retransmission before any
            # data keeps the connection).
            done = finish(conn)
            del conns[key]
            conn = None
            if done is not None:
                yield done
        if conn is None:
            conn = conns[key] = _Conn(src, dst, src if syn else None)
            if flags & _SYN and flags & _ACK:
                conn.client = dst
                conn.handshake_seen = True
        half = conn.halves[src]
        payload = bytes(tcp.data)
        # Bytes the capture cut off (snap length) are missing: a gap after what is there.
        if isinstance(ip, dpkt.ip.IP):
            real = ip.len - ip.hl * 4 - tcp.off * 4
        elif ip.nxt == 6:  # IPv6 without extension headers
            real = ip.plen - tcp.off * 4
        else:
            real = len(payload)
        if flags & _SYN:
            if half.base is None:
                half.base = half.next = tcp.seq + 1
            continue
        if half.base is None:
            half.base = half.next = tcp.seq
        start = half.unwrap(tcp.seq)
        if payload and half.gap is None:
            _accept(conn, half, src, start, payload, time_ns)
            if len(payload) < real and half.next == start + len(payload):
                half.gap = half.next - half.base
        if flags & _RST:
            conn.reset = True
        elif flags & _FIN:
            half.closed = True
        if conn.finished():
            done = finish(conn)
            del conns[key]
            if done is not None:
                yield done
    for conn in list(conns.values()):
        done = finish(conn)
        if done is not None:
            yield done


def _accept(conn: _Conn, half: _Half, src: tuple[str, int], start: int, payload: bytes, time_ns: int) -> None:
    end = start + len(payload)
    if end <= half.next:
        return  # a retransmission of bytes we have
    if start > half.next:
        old = half.ooo.get(start)
        if old is None or len(old) < len(payload):
            half.held += len(payload) - (len(old) if old else 0)
            half.ooo[start] = payload
        if half.held > MAX_OUT_OF_ORDER:
            assert half.base is not None
            half.gap = half.next - half.base
            half.ooo.clear()
            half.held = 0
        return
    data = payload[half.next - start :]
    conn.chunks.append((time_ns, src, data))
    half.next = end
    while half.ooo:
        ready = [s for s in half.ooo if s <= half.next]
        if not ready:
            break
        for s in sorted(ready):
            seg = half.ooo.pop(s)
            half.held -= len(seg)
            if s + len(seg) > half.next:
                conn.chunks.append((time_ns, src, seg[half.next - s :]))
                half.next = s + len(seg)


def read_pcap(path: str | os.PathLike[str]) -> Iterator[Flow]:
    """The TCP flows with payload in a pcap or pcapng file, each as soon as it ends
    (FIN both ways, or RST), the rest at the end of the file. ``OSError`` if the file
    cannot be read, ``ValueError`` if it is not a pcap/pcapng file or its link type is not
    supported. A file cut short ends the flows where it ends."""
    where = os.fspath(path)
    with open(where, "rb") as f:
        yield from _flows(f, where)


def read_pcap_bytes(data: bytes, *, name: str = "capture") -> Iterator[Flow]:
    """Like :func:`read_pcap`, from the file's contents."""
    yield from _flows(io.BytesIO(bytes(data)), name)
