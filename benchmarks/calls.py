"""Python calls on the data path, counted with ``sys.setprofile`` (no clock: the same count
on any machine, loaded or not).

Two real :class:`polymux.aio.session.MuxProtocol` objects on in-memory transports (those of
:mod:`benchmarks.bench_frames`), on uvloop (its loop is compiled, so what is counted is
polymux's own Python and the stdlib streams it uses), one open channel, warmed up. Then:

* **receive**: one data frame of 100 bytes reaches the receiver (its ``data_received``),
  the application reads it (``await reader.read(4096)``, the reader idle when it arrives),
  and the loop turn after the read runs (where credit goes back);
* **write**: ``writer.write(100 bytes)``, then the loop turn that hands it to the socket
  transport.

For reference, CPython's own streams take 6 calls to receive and read a chunk and 2 to
write one. ::

    .venv/bin/python -m benchmarks.calls                 # every format
    .venv/bin/python -m benchmarks.calls --formats yamux --list
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import Counter
from types import FrameType
from typing import Any, Self

import polymux

from .bench_frames import Side, join


PAYLOAD = 100


_COUNTED = (
    os.path.dirname(polymux.__file__),
    os.path.dirname(asyncio.__file__) + os.sep + "streams.py",
    "<string>",  # what dataclasses and NamedTuples generate (__init__, __new__)
)
"""Calls counted: polymux's own code and the stdlib streams it uses (not the harness,
nor ``asyncio.sleep`` that turns the loop)."""


class Counted:
    """Counts Python function calls (not C calls) while enabled, by function."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(_COUNTED):
                self.calls[f"{code.co_filename.rsplit('/', 2)[-1]}:{code.co_qualname}"] += 1

    def __enter__(self) -> Self:
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)

    @property
    def total(self) -> int:
        return sum(self.calls.values())


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def count(fmt: str) -> tuple[Counted, Counted]:
    """``(receive, write)`` call counts of one 100-byte data frame on ``fmt``."""
    client, server = Side(fmt, client=True), Side(fmt, client=False)
    join(client, server)
    _reader, writer = await client.protocol.session.open_channel("calls")
    writer.write(b"x")  # formats that open on the first data
    await writer.drain()
    sreader, _swriter = await server.incoming.get()
    assert await sreader.read(4096) == b"x"
    # Warm up: several frames each way, credit included, caches filled.
    for _ in range(20):
        writer.write(b"w" * PAYLOAD)
        await writer.drain()
        await _turns(3)
        assert len(await sreader.read(4096)) == PAYLOAD
        await _turns(3)
    # One frame as the receiver gets it: the client's bytes, captured from its transport.
    sent: list[bytes] = []
    client.transport.peer = None
    original = client.transport.writelines

    def capture(list_of_data: Any) -> None:
        sent.append(b"".join(list_of_data))
        original(list_of_data)

    client.transport.writelines = capture  # type: ignore[method-assign]
    writer.write(b"r" * PAYLOAD)
    await _turns(3)
    frame = b"".join(sent)
    assert frame, "the client sent nothing"
    client.transport.writelines = original  # type: ignore[method-assign]
    with Counted() as receive:
        server.protocol.data_received(frame)
        data = await sreader.read(4096)
        await _turns(2)
    assert data == b"r" * PAYLOAD, data
    await _turns(3)
    # One write, and the loop turn that sends it (the receiver gets it afterwards).
    sent.clear()
    client.transport.writelines = capture  # type: ignore[method-assign]
    with Counted() as write:
        writer.write(b"s" * PAYLOAD)
        await _turns(1)
    client.transport.writelines = original  # type: ignore[method-assign]
    client.transport.peer = server.protocol
    server.protocol.data_received(b"".join(sent))
    assert len(await sreader.read(4096)) == PAYLOAD
    return receive, write


def main() -> None:  # pragma: no cover - a command-line tool
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--formats", default=",".join(polymux.PROTOCOLS))
    parser.add_argument("--list", action="store_true", help="the calls by function")
    args = parser.parse_args()
    import uvloop

    print(f"{'format':<20}{'receive':>9}{'write':>7}   Python calls for one {PAYLOAD}-byte data frame")
    for fmt in args.formats.split(","):
        receive, write = uvloop.run(count(fmt))
        print(f"{fmt:<20}{receive.total:>9}{write.total:>7}")
        if args.list:
            for title, counted in (("receive", receive), ("write", write)):
                print(f"  {title}:")
                for name, n in counted.calls.most_common():
                    print(f"    {n:>3}  {name}")


if __name__ == "__main__":
    main()
