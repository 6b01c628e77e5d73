"""polymux demo: a real multi-channel file transfer on loopback. It writes a set of files
of random data to a temporary directory, starts an embedded file server (the receiver of
polymux.apps.filetransfer, the same code as polymux receive) on
127.0.0.1, connects to it over one connection, and sends the files in parallel, one
channel per file, with progress bars (plain progress lines without a terminal). Every
file is SHA-256 verified end to end, then compared on disk; the summary gives the
throughput. --interrupt cuts the first connection part-way and resumes on a new one:
only what is missing is sent.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import polymux
from polymux.apps.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STATUS,
    conversation_options,
    format_bytes,
    run as run_loop,
    size_type,
)
from polymux.apps.filetransfer import Receiver, Transfer, send_with_progress, summary


__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux demo``."""
    demo = sub.add_parser(
        "demo",
        help="parallel file transfer to an embedded server, with progress bars",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument(
        "--protocol",
        default="mstream-v3",
        choices=polymux.PROTOCOLS,
        metavar="PROTOCOL",
        help=f"wire format: {', '.join(polymux.PROTOCOLS)} (default mstream-v3)",
    )
    demo.add_argument("--files", type=int, default=16, help="files, one channel each (default 16)")
    demo.add_argument(
        "--total",
        "--size",
        type=size_type(1024),
        default=64 << 20,
        metavar="SIZE",
        help="bytes in all the files together: 256MiB, 1GiB; a number without a unit is bytes, as "
        "everywhere (default 64MiB; at least 1KiB)",
    )
    demo.add_argument("--parallel", type=int, default=8, help="channels in flight at once (default 8)")
    demo.add_argument(
        "--progress",
        choices=("auto", "rich", "plain", "none"),
        default="auto",
        help="bars on a terminal, plain lines otherwise (default auto)",
    )
    demo.add_argument(
        "--interrupt",
        type=int,
        nargs="?",
        const=50,
        metavar="PERCENT",
        help="cut the connection at PERCENT (50) of the bytes, then resume on a new one",
    )
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory")
    demo.add_argument("--uvloop", action="store_true", help="run on uvloop")
    demo.set_defaults(func=run, parser=demo)


def run(args: argparse.Namespace) -> int:
    """Run the demo."""
    if args.files < 1 or args.parallel < 1:
        args.parser.error("--files and --parallel must be >= 1")
    if args.total < args.files:
        args.parser.error(f"--total {args.total} is less than one byte per file ({args.files} files)")
    if args.interrupt is not None and not 1 <= args.interrupt <= 99:
        args.parser.error("--interrupt must be a percentage in 1..99")
    work = Path(tempfile.mkdtemp(prefix="polymux-demo-"))
    try:
        transfers = _make_files(work / "outbox", args.files, args.total)
        return run_loop(_demo(args, work, transfers), use_uvloop=args.uvloop)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _make_files(outbox: Path, files: int, total: int) -> list[Transfer]:
    """``files`` files of random bytes, sizes growing with the index, ``total`` bytes in all."""
    weight = files * (files + 1) / 2
    transfers = []
    for i in range(files):
        size = max(1, int(total * (i + 1) / weight))
        name = f"{['docs', 'media', 'logs', 'data'][i % 4]}/file-{i:02d}.bin"
        path = outbox / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
        transfers.append(Transfer(path, name, size))
    return transfers


async def _demo(args: argparse.Namespace, work: Path, transfers: list[Transfer]) -> int:
    log: list[str] = []
    receiver = Receiver(work / "inbox", log=log.append)
    # A file's channel is a conversation (offer, accept, data ...): on Streamux the
    # receiver answers before the request ends, a polymux extension both ends here share.
    server = await polymux.start_server(
        receiver.handle, "127.0.0.1", 0, protocol=args.protocol, **conversation_options(args.protocol)
    )
    async with server:
        total = sum(t.size for t in transfers)
        at_once = min(args.parallel, len(transfers))
        print(
            f"polymux demo: {len(transfers)} files, {format_bytes(total)} in all, one channel per file "
            f"({at_once} at a time),\n  over one {args.protocol} connection to an embedded file "
            f"server on 127.0.0.1:{server.port}",
            flush=True,
        )
        if args.interrupt is not None:
            await _interrupted_pass(args, server.port, transfers)
        async with await polymux.connect("127.0.0.1", server.port, protocol=args.protocol) as session:
            elapsed = await send_with_progress(
                session, transfers, parallel=args.parallel, progress=args.progress
            )
    # The receiver verified each SHA-256 before renaming; check the files on disk once more.
    on_disk = sum(
        _sha256(receiver.root / t.name) == t.sha256 != ""
        for t in transfers
        if (receiver.root / t.name).exists()
    )
    failed = [t for t in transfers if t.status == "failed"]
    for t in failed:
        print(f"FAILED {t.name}: {t.error}", file=sys.stderr)
    print(summary(transfers, elapsed, min(args.parallel, len(transfers))), flush=True)
    # The folder is removed on exit unless --keep: name it only when it stays.
    where = f" to {receiver.root}" if args.keep else ""
    print(
        f"receiver: {receiver.stats.files} files written{where}, "
        f"{on_disk}/{len(transfers)} identical to the originals (SHA-256 on disk)",
        flush=True,
    )
    return EXIT_OK if not failed and on_disk == len(transfers) else EXIT_FAILED


async def _interrupted_pass(args: argparse.Namespace, port: int, transfers: list[Transfer]) -> None:
    """Send until ``args.interrupt`` percent of the bytes are out, then cut the
    connection (as a network failure would); the receiver keeps the partial files."""
    first = [Transfer(t.path, t.name, t.size) for t in transfers]
    threshold = sum(t.size for t in first) * args.interrupt / 100
    session = await polymux.connect("127.0.0.1", port, protocol=args.protocol)

    at_cut = 0

    def maybe_cut(_t: Transfer) -> None:
        nonlocal at_cut
        if not session.is_closed and (written := sum(t.done for t in first)) >= threshold:
            at_cut = written
            session.abort()

    async with session:
        await send_with_progress(
            session,
            first,
            parallel=args.parallel,
            progress=args.progress,
            on_progress=maybe_cut,
            cut=lambda: session.is_closed,
        )
    complete = sum(t.status == "done" for t in first)
    total = sum(t.size for t in first)
    print(
        f"-- the connection was cut at {args.interrupt}% ({format_bytes(at_cut)} of {format_bytes(total)} "
        f"written; {complete} files complete, {len(first) - complete} not); the receiver keeps the "
        "partial files. Resuming on a new connection: only what is missing is sent.",
        flush=True,
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
