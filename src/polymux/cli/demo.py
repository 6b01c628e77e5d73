"""``polymux demo`` starts an embedded server on 127.0.0.1 and sends several files to it in
parallel over one connection, one channel per file, checking a SHA-256 of each.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import time

import polymux


__all__ = ["register", "run"]


async def _receive_file(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Server side: hash everything the channel brings, answer with the digest."""
    digest = hashlib.sha256()
    while chunk := await reader.read(256 * 1024):
        digest.update(chunk)
    writer.write(digest.hexdigest().encode())
    writer.write_eof()
    await writer.drain()
    writer.close()


async def _demo(protocol: str, files: int, size_mib: float, progress: bool) -> int:
    server = await polymux.start_server(_receive_file, "127.0.0.1", 0, protocol=protocol)
    async with server:
        session = await polymux.connect("127.0.0.1", server.port, protocol=protocol)
        async with session:
            # Sizes grow with the index and add up to size_mib.
            weight = files * (files + 1) / 2
            sizes = [max(1, int(size_mib * (1 << 20) * (i + 1) / weight)) for i in range(files)]
            sent = [0] * files
            print(
                f"polymux demo: {files} files, {sum(sizes) / (1 << 20):.1f} MiB in all, one channel "
                f"each, over one {protocol} connection to an embedded server on 127.0.0.1:{server.port}"
            )

            async def send(i: int) -> tuple[str, bool]:
                name = f"file/{i:02d}.bin"
                data = os.urandom(sizes[i])
                reader, writer = await session.open_channel(name)
                view = memoryview(data)
                for off in range(0, len(data), 64 * 1024):
                    writer.write(view[off : off + 64 * 1024])
                    await writer.drain()
                    sent[i] = min(len(data), off + 64 * 1024)
                writer.write_eof()
                answer = (await reader.read()).decode()
                writer.close()
                return name, answer == hashlib.sha256(data).hexdigest()

            async def show() -> None:
                while True:
                    bars = " ".join(f"{100 * s // n:3d}%" for s, n in zip(sent, sizes, strict=True))
                    print(f"\r  {bars}", end="", flush=True)
                    await asyncio.sleep(0.2)

            ticker = asyncio.create_task(show()) if progress else None
            start = time.perf_counter()
            results = await asyncio.gather(*(send(i) for i in range(files)))
            elapsed = time.perf_counter() - start
            if ticker is not None:
                ticker.cancel()
                print()
    for (name, ok), size in zip(results, sizes, strict=True):
        print(f"  {name}  {size / (1 << 20):7.2f} MiB  sha256 {'ok' if ok else 'MISMATCH'}")
    total = sum(sizes) / (1 << 20)
    print(f"{total:.1f} MiB in {elapsed:.2f} s = {total / elapsed:.0f} MiB/s over {files} channels")
    return 0 if all(ok for _n, ok in results) else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux demo``."""
    demo = sub.add_parser("demo", help="parallel file transfer to an embedded server", description=__doc__)
    demo.add_argument("--protocol", default="mstream-v3", choices=polymux.PROTOCOLS)
    demo.add_argument("--files", type=int, default=8, help="files (channels) in parallel")
    demo.add_argument("--size", type=float, default=64.0, help="MiB in all")
    demo.add_argument("--uvloop", action="store_true", help="run on uvloop")
    demo.set_defaults(func=run, parser=demo)


def run(args: argparse.Namespace) -> int:
    """Run the demo."""
    if args.files < 1 or args.size <= 0:
        args.parser.error("--files must be >= 1 and --size > 0")
    coro = _demo(args.protocol, args.files, args.size, sys.stdout.isatty())
    if args.uvloop:
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)
