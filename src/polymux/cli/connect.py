"""polymux connect: a multiplexed iperf. Opens N channels on one connection, sends a
pattern (or a file) on each, checks that every byte comes back unchanged (polymux serve
--echo, or any peer that echoes channels), and prints a summary: bytes, seconds, MB/s
(10^6 bytes per second, one direction; only for a run that succeeded).

Modes: echo (the default) verifies the echo byte by byte; --send-only sends and waits for
the peer to close each channel (polymux serve --discard); on formats whose channels are
one-way (omnistreams: the opener writes, the acceptor reads) the mode is one-way: data is
sent, nothing can come back, so nothing is verified, and the summary says so.

Each channel gets its own pattern (a pseudo-random block per channel, or --pattern TEXT
repeated), so an echo on the wrong channel is caught. --timeout bounds the whole run,
connection and handshake included. A peer that speaks another wire format is named as
such (exit status 3, like a connection that cannot be made); a channel that fails, an
echo that differs, a run that times out or a --file that cannot be read exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import time
from typing import Any

import polymux
from polymux.apps.common import (
    EXIT_FAILED,
    EXIT_NO_SESSION,
    EXIT_OK,
    EXIT_STATUS,
    Address,
    NoSession,
    add_address_options,
    add_session_options,
    check_session_options,
    connect,
    format_bytes,
    parse_address,
    peer_mismatch,
    run as run_loop,
    session_options,
    size,
    size_type,
    two_way,
)


__all__ = ["register", "run"]


class Mismatch(Exception):
    """The echo differs from what was sent."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux connect``."""
    parser = sub.add_parser(
        "connect",
        help="open N channels, send, verify the echo, print the throughput",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_session_options(parser)
    add_address_options(parser)
    parser.add_argument("--channels", "-n", type=int, default=4, metavar="N", help="channels (default 4)")
    parser.add_argument(
        "--size",
        type=size,
        default=16 * 1024 * 1024,
        metavar="SIZE",
        help="bytes per channel: 1048576 (bytes), 512KiB, 16MiB (default 16MiB)",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--pattern", metavar="TEXT", help="send TEXT repeated (default: a random block per channel)"
    )
    what.add_argument("--file", metavar="PATH", help="send this file on every channel (--size is its size)")
    parser.add_argument(
        "--send-only", action="store_true", help="do not expect an echo (for polymux serve --discard)"
    )
    parser.add_argument(
        "--chunk",
        type=size_type(64),
        default=64 * 1024,
        metavar="SIZE",
        help="write size (default 64KiB; at least 64 bytes)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="give up after this long, connection included (default 120)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.set_defaults(func=run, parser=parser)


class _Source:
    """The bytes one channel sends: ``read(offset, n)``."""

    def __init__(self, size: int, block: bytes | None = None, fd: int | None = None) -> None:
        self.size = size
        self.fd = fd
        if block is not None:
            # The block repeated enough to slice any read (256 KiB) at any offset.
            self.period = len(block)
            self.big = block * ((512 * 1024) // len(block) + 2)

    def read(self, offset: int, n: int) -> bytes:
        n = min(n, self.size - offset)
        if self.fd is not None:
            data = os.pread(self.fd, n, offset)
            if len(data) != n:
                raise OSError(f"the file shrank: {len(data)} of {n} bytes at offset {offset}")
            return data
        start = offset % self.period
        if n <= len(self.big) - start:
            return self.big[start : start + n]
        return b"".join(self.read(offset + i, min(256 * 1024, n - i)) for i in range(0, n, 256 * 1024))


def run(args: argparse.Namespace) -> int:
    """Run ``polymux connect``."""
    try:
        address = parse_address(args.tcp, args.unix)
        options = session_options(args)
        check_session_options(args.protocol, options)
        if args.channels < 1:
            raise ValueError(f"--channels must be >= 1, got {args.channels}")
        if args.timeout <= 0:
            raise ValueError(f"--timeout must be positive, got {args.timeout}")
        if args.pattern is not None and not args.pattern:
            raise ValueError("--pattern must not be empty")
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))
    fd = None
    if args.file is not None:  # an input that cannot be read (or is empty) fails the work: 1
        try:
            fd = os.open(args.file, os.O_RDONLY)
            args.size = os.fstat(fd).st_size
        except OSError as exc:
            print(f"polymux connect: cannot read --file {args.file}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILED
        if args.size == 0:
            os.close(fd)
            print(f"polymux connect: --file {args.file} is empty: nothing to send", file=sys.stderr)
            return EXIT_FAILED
    # Every failure reaches the channels and is reported below, with the diagnosis; the
    # library's own warning about it would only repeat it, unformatted.
    logging.getLogger("polymux").setLevel(logging.ERROR)
    try:
        return run_loop(_main(args, address, options, fd), use_uvloop=args.uvloop)
    finally:
        if fd is not None:
            os.close(fd)


def _sources(args: argparse.Namespace, fd: int | None) -> list[_Source]:
    if fd is not None:
        return [_Source(args.size, fd=fd) for _ in range(args.channels)]
    if args.pattern is not None:
        block = args.pattern.encode()
        return [_Source(args.size, block=block) for _ in range(args.channels)]
    # A prime-sized block per channel: repeats never line up with chunk boundaries.
    return [_Source(args.size, block=random.Random(i).randbytes(65521)) for i in range(args.channels)]


async def _main(args: argparse.Namespace, address: Address, options: dict[str, Any], fd: int | None) -> int:
    protocol = args.protocol
    if not two_way(protocol):
        mode = "one-way"
        note = f"{protocol} channels are one-way (the opener writes): sending without echo verification"
    elif args.send_only:
        mode, note = "send-only", "sending; the peer reads and closes (no echo expected)"
    else:
        mode, note = "echo", "sending and verifying the echo byte by byte"
    if not args.json:
        print(f"polymux connect: mode {mode}: {note}", flush=True)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.timeout
    try:
        session = await connect(address, protocol, timeout=args.timeout, **options)
    except NoSession as exc:
        _fail(args, address, f"{exc}")
        return EXIT_NO_SESSION
    sources = _sources(args, fd)
    echoed = [0] * args.channels
    written = [0] * args.channels
    start = time.perf_counter()
    errors: list[str] = []
    waited: float | None = None  # the run timed out: the peer stayed silent, it did not close
    try:
        async with asyncio.timeout_at(deadline):
            results = await asyncio.gather(
                *(
                    _channel(session, i, src, mode, args.chunk, echoed, written)
                    for i, src in enumerate(sources)
                ),
                return_exceptions=True,
            )
            errors = [f"channel {i}: {r}" for i, r in enumerate(results) if isinstance(r, BaseException)]
            await session.aclose()  # one-way: returns once everything queued is sent
            if not errors and session.exception is not None:
                errors.append(f"the session failed: {session.exception}")
    except TimeoutError:
        errors.append(f"timed out after {args.timeout:g} s")
        waited = args.timeout
        session.abort()
    elapsed = time.perf_counter() - start
    if errors and (why := peer_mismatch(session, waited=waited)) is not None:
        # Nothing of our format ever came back: there was no session, whatever the channels say.
        _fail(args, address, f"no {protocol} session with {address}: {why}")
        return EXIT_NO_SESSION
    planned = args.size * args.channels
    # What the peer took (drain() returned); the planned total once every channel is done.
    sent = planned if not errors else sum(written)
    summary = {
        "protocol": protocol,
        "address": str(address),
        "mode": mode,
        "channels": args.channels,
        "bytes_per_channel": args.size,
        "bytes": sent,
        "planned_bytes": planned,
        "echoed": sum(echoed),
        "verified": mode == "echo" and not errors,
        "seconds": round(elapsed, 4),
        # A rate only for a run that did what it was asked: a failed run's figure means nothing.
        "mb_per_s": round(sent / elapsed / 1e6, 2) if elapsed > 0 and not errors else None,
        "errors": errors,
    }
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        for error in errors:
            print(f"polymux connect: {error}", file=sys.stderr, flush=True)
        check = {
            "echo": "echoed and verified" if not errors else "NOT verified",
            "send-only": "sent (no echo expected)",
            "one-way": "sent one-way (nothing verified: no echo possible)",
        }[mode]
        head = (
            f"polymux connect: {args.channels} channels x {format_bytes(args.size)} = {format_bytes(planned)}"
        )
        where = f"({protocol} over {address})"
        if errors:
            print(
                f"{head} FAILED after {elapsed:.3f} s: {format_bytes(sent)} sent, "
                f"{format_bytes(sum(echoed))} echoed; {len(errors)} failed {where}",
                flush=True,
            )
        else:
            print(f"{head} {check}, in {elapsed:.3f} s: {sent / elapsed / 1e6:.1f} MB/s {where}", flush=True)
    return EXIT_FAILED if errors else EXIT_OK


def _fail(args: argparse.Namespace, address: Address, message: str) -> None:
    """Report a run that never had a session (one JSON object with ``--json``)."""
    if args.json:
        print(
            json.dumps({"protocol": args.protocol, "address": str(address), "errors": [message]}), flush=True
        )
    print(f"polymux connect: {message}", file=sys.stderr, flush=True)


async def _channel(
    session: polymux.Session,
    index: int,
    source: _Source,
    mode: str,
    chunk: int,
    echoed: list[int],
    written: list[int],
) -> None:
    reader, writer = await session.open_channel(f"connect/{index}")
    size = source.size

    async def send() -> None:
        for offset in range(0, size, chunk):
            data = source.read(offset, chunk)
            writer.write(data)
            await writer.drain()
            written[index] += len(data)
        if mode == "one-way":
            writer.close()
            await writer.wait_closed()  # raises if the session died with data unsent
        else:
            writer.write_eof()
            await writer.drain()

    async def receive() -> None:
        got = 0
        while data := await reader.read(256 * 1024):
            if mode != "echo":
                raise Mismatch(f"the peer sent {len(data)} bytes back in {mode} mode")
            expected = source.read(got, len(data))
            if data != expected:
                at = next(
                    (i for i, (a, b) in enumerate(zip(data, expected, strict=False)) if a != b), len(expected)
                )
                raise Mismatch(f"the echo differs at byte {got + at}")
            got += len(data)
            echoed[index] = got
        if mode == "echo" and got != size:
            hint = ""
            if polymux.formats.get(session.protocol).caps.conversation_option is not None:
                # Request/response (Streamux): a responder cannot fail a request on the
                # wire, it can only end the response early.
                hint = (
                    f" ({session.protocol} has no way to report a failed request: the server ended "
                    "its response early; its log says why)"
                )
            raise Mismatch(f"the echo ended after {got} of {size} bytes{hint}")

    try:
        if mode == "one-way":
            await send()
        else:
            await asyncio.gather(send(), receive())
            writer.close()
    except BaseException:
        writer.transport.abort()
        raise
