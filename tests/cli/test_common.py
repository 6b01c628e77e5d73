"""The helpers behind the command line and the example apps: sizes, addresses, which
formats have two-way channels, and the length-prefixed msgpack records."""

from __future__ import annotations

import asyncio
import struct

import msgpack
import pytest

import polymux
from polymux.apps.common import Address, format_bytes, parse_address, parse_size, two_way
from polymux.apps.records import RecordError, encode_record, read_record
from polymux.formats import make_engine


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        ("64K", 65536),
        ("16M", 16 << 20),
        ("1.5G", 3 << 29),
        ("2MiB", 2 << 20),
        ("10kb", 10240),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1", "0", "1X", "M"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a size|below the minimum"):
        parse_size(text)


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1024, 5 << 20, 3 << 30)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "5.0 MiB",
        "3.0 GiB",
    ]


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:9000", None) == Address(host="127.0.0.1", port=9000)
    assert parse_address(":0", None) == Address(host="127.0.0.1", port=0)
    assert parse_address("[::1]:80", None) == Address(host="::1", port=80)
    assert str(parse_address("[::1]:80", None)) == "tcp:[::1]:80"
    assert parse_address(None, "/tmp/x.sock") == Address(path="/tmp/x.sock")
    for tcp in ("localhost", "h:http", "h:70000", "h:"):
        with pytest.raises(ValueError, match="--tcp: expected HOST:PORT"):
            parse_address(tcp, None)
    with pytest.raises(ValueError, match="107 bytes"):
        parse_address(None, "/tmp/" + "x" * 120)
    with pytest.raises(ValueError, match="give --tcp"):
        parse_address(None, None)


def test_two_way_follows_the_engines() -> None:
    for protocol in polymux.PROTOCOLS:
        engine = make_engine(protocol)
        assert two_way(protocol) is not getattr(engine, "one_way", False), protocol
    assert two_way("mstream-v3") and two_way("yamux") and two_way("streamux")


async def read(data: bytes, **kw: int) -> object:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return await read_record(reader, **kw)


async def test_records_round_trip_and_errors() -> None:
    record = {"type": "offer", "name": "a/b", "size": 5, "blob": b"\x00\xff"}
    assert await read(encode_record(record)) == record
    assert await read(b"") is None  # a clean end between records
    with pytest.raises(RecordError, match="inside a length prefix"):
        await read(b"\x00\x00")
    with pytest.raises(RecordError, match="length 70000 exceeds the limit of 65536"):
        await read(struct.pack(">I", 70000))
    with pytest.raises(RecordError, match="after 2 of 10 bytes"):
        await read(struct.pack(">I", 10) + b"ab")
    with pytest.raises(RecordError, match="expected a msgpack map, got list"):
        await read(encode_record([1, 2]))  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="field 'type' must be a string"):
        await read(encode_record({"kind": 1}))
    body = b"\xc1"  # never used in msgpack
    with pytest.raises(RecordError, match="not valid msgpack"):
        await read(struct.pack(">I", len(body)) + body)
    body = msgpack.packb({1: 2})
    with pytest.raises(RecordError, match="not valid msgpack"):
        await read(struct.pack(">I", len(body)) + body)
