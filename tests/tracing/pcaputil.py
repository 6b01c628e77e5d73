"""Write pcap / pcapng files of a TCP connection carrying given chunks, with dpkt (the
container format and the Ethernet/IP/TCP headers are dpkt's; sequence numbers are ours)."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from pathlib import Path

import dpkt


CLIENT = ("127.0.0.1", 40000)
SERVER = ("127.0.0.1", 9000)
CLIENT6 = ("::1", 40000)
SERVER6 = ("::1", 9000)


class Packets:
    """Builds the packets of one TCP connection (client ``a``, server ``b``)."""

    def __init__(self, a: tuple[str, int], b: tuple[str, int], isn: tuple[int, int], linktype: int) -> None:
        self.ends = {"c2s": (a, b), "s2c": (b, a)}
        self.seq = {"c2s": isn[0], "s2c": isn[1]}
        self.linktype = linktype
        self.out: list[tuple[int, bytes]] = []

    def _ip(self, src: str, dst: str, tcp: dpkt.tcp.TCP) -> dpkt.Packet:
        raw = bytes(tcp)
        if ":" in src:
            ip = dpkt.ip6.IP6(
                src=socket.inet_pton(socket.AF_INET6, src),
                dst=socket.inet_pton(socket.AF_INET6, dst),
                nxt=dpkt.ip.IP_PROTO_TCP,
                hlim=64,
                plen=len(raw),
                data=tcp,
            )
            ip.extension_hdrs = {}
            return ip
        ip = dpkt.ip.IP(
            src=socket.inet_aton(src), dst=socket.inet_aton(dst), p=dpkt.ip.IP_PROTO_TCP, ttl=64, data=tcp
        )
        ip.len = 20 + len(raw)
        return ip

    def packet(
        self, t: int, direction: str, flags: int, payload: bytes = b"", seq: int | None = None
    ) -> bytes:
        (src, sport), (dst, dport) = self.ends[direction]
        other = "s2c" if direction == "c2s" else "c2s"
        tcp = dpkt.tcp.TCP(
            sport=sport,
            dport=dport,
            seq=(self.seq[direction] if seq is None else seq) & 0xFFFFFFFF,
            ack=self.seq[other] & 0xFFFFFFFF,
            flags=flags,
            win=65535,
            data=payload,
        )
        ip = self._ip(src, dst, tcp)
        if self.linktype == dpkt.pcap.DLT_RAW:
            frame = bytes(ip)
        else:
            eth_type = dpkt.ethernet.ETH_TYPE_IP6 if ":" in src else dpkt.ethernet.ETH_TYPE_IP
            frame = bytes(dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, type=eth_type, data=ip))
        self.out.append((t, frame))
        return frame

    def handshake(self, t: int) -> None:
        self.packet(t, "c2s", dpkt.tcp.TH_SYN)
        self.seq["c2s"] += 1
        self.packet(t, "s2c", dpkt.tcp.TH_SYN | dpkt.tcp.TH_ACK)
        self.seq["s2c"] += 1
        self.packet(t, "c2s", dpkt.tcp.TH_ACK)

    def data(self, t: int, direction: str, payload: bytes) -> None:
        self.packet(t, direction, dpkt.tcp.TH_ACK | dpkt.tcp.TH_PUSH, payload)
        self.seq[direction] += len(payload)

    def fin(self, t: int) -> None:
        for direction in ("c2s", "s2c"):
            self.packet(t, direction, dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK)
            self.seq[direction] += 1


def connection(
    chunks: Iterable[tuple[int, str, bytes]],
    *,
    v6: bool = False,
    isn: tuple[int, int] = (0xFFFFF000, 0x7FFFFFF0),  # the client's wraps around 2**32
    mss: int = 1448,
    linktype: int = dpkt.pcap.DLT_EN10MB,
    disorder: bool = True,
    drop_c2s_segment: int | None = None,
) -> list[tuple[int, bytes]]:
    """Packets of a connection carrying ``chunks``. With ``disorder``: the 3rd and 4th c2s
    segments swap places, the 5th c2s segment is sent twice, and the 6th s2c segment is
    re-sent with the last 100 bytes of the segment before it (an overlapping
    retransmission). ``drop_c2s_segment``: that c2s segment never appears."""
    chunks = list(chunks)
    a, b = (CLIENT6, SERVER6) if v6 else (CLIENT, SERVER)
    p = Packets(a, b, isn, linktype)
    p.handshake(chunks[0][0] - 1000)
    count = {"c2s": 0, "s2c": 0}
    held: bytes | None = None
    last: dict[str, tuple[int, bytes]] = {}
    for t, direction, data in chunks:
        for pos in range(0, len(data), mss):
            seg = data[pos : pos + mss]
            count[direction] += 1
            n = count[direction]
            start = p.seq[direction]
            if direction == "c2s" and n == drop_c2s_segment:
                p.seq[direction] += len(seg)
                continue
            if disorder and direction == "c2s" and n == 3:
                held = p.packet(t, direction, dpkt.tcp.TH_ACK, seg)  # built now, sent after the 4th
                p.out.pop()
                p.seq[direction] += len(seg)
                continue
            if disorder and direction == "s2c" and n == 6 and direction in last:
                _start, prev = last[direction]
                overlap = prev[-100:]
                p.packet(t, direction, dpkt.tcp.TH_ACK, overlap + seg, seq=start - len(overlap))
                p.seq[direction] += len(seg)
            else:
                p.data(t, direction, seg)
            if held is not None and direction == "c2s" and n == 4:
                p.out.append((t, held))
                held = None
            if disorder and direction == "c2s" and n == 5:
                p.packet(t, direction, dpkt.tcp.TH_ACK, seg, seq=start)  # a retransmission
            last[direction] = (start, seg)
    if held is not None:
        p.out.append((chunks[-1][0], held))
    p.fin(chunks[-1][0] + 1000)
    return p.out


def write(
    path: Path, packets: list[tuple[int, bytes]], *, ng: bool = False, linktype: int = dpkt.pcap.DLT_EN10MB
) -> None:
    """Write ``(time_ns, frame)`` packets as pcap (nanosecond) or pcapng."""
    with path.open("wb") as f:
        writer = (
            dpkt.pcapng.Writer(f, snaplen=65535, linktype=linktype)
            if ng
            else dpkt.pcap.Writer(f, snaplen=65535, linktype=linktype, nano=True)
        )
        for t, frame in packets:
            writer.writepkt(frame, ts=t / 1e9)
