"""File transfer over polymux: many files in parallel, one channel per file, SHA-256
verified end to end, interrupted transfers resumed, and destination paths that cannot
escape the target directory.

One channel carries one file (records are :mod:`polymux.apps.records`)::

    sender                                   receiver
    offer {name, size}              ->       checks the name (path safety), finds a partial
                                    <-       accept {offset, prefix_sha256} | error {code, message}
    start {offset}                  ->       offset = the accepted one if the sender's first
                                             offset bytes hash to prefix_sha256, else 0
    size - offset raw bytes         ->       appended to DEST/NAME.polymux-part, hashed
    end {sha256}, end of writing    ->       the SHA-256 of the whole file
                                    <-       done {sha256, resumed_from} | error {code, message}

The receiver keeps ``NAME.polymux-part`` when a transfer is cut (the sender killed, the
connection lost) and offers its length and the SHA-256 of its content at the next attempt,
so only the rest is sent; the final SHA-256 covers the whole file as written on disk, and
only a verified file is renamed to ``NAME``. A file that already exists with the offered
size is offered whole: if it matches, nothing is sent (``unchanged``).

Path safety (:func:`check_name`, :func:`destination`): a name is a relative POSIX path;
empty names, NUL bytes, control characters, backslashes, absolute paths, drive letters,
empty, ``.`` or ``..`` components, over-long names and the ``.polymux-part`` suffix are
refused with an ``unsafe-name`` error sent back to the sender (and logged). The joined
path is resolved (symlinks followed) and must stay inside the target directory; files are
opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import random
import re
import stat
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field as dc_field
from pathlib import Path, PurePosixPath
from typing import IO, Any, Self

from polymux import formats
from polymux._extras import require
from polymux.aio.session import Session
from polymux.apps.common import NoSession, format_bytes
from polymux.apps.records import RecordError, field, read_record, write_record
from polymux.exceptions import PolymuxError


__all__ = [
    "BACKOFF_CAP",
    "BACKOFF_FIRST",
    "CHUNK",
    "DEFAULT_RETRIES",
    "PART_SUFFIX",
    "RETRYABLE",
    "PlainProgress",
    "RateLimiter",
    "Receiver",
    "RichProgress",
    "SendResult",
    "Transfer",
    "TransferError",
    "UnsafeName",
    "backoff",
    "check_name",
    "collect",
    "destination",
    "make_progress",
    "send_file",
    "send_files",
    "send_with_progress",
    "send_with_retries",
    "summary",
]

PART_SUFFIX = ".polymux-part"
"""Suffix of a partially received file (kept for resume)."""

CHUNK = 256 * 1024
"""Bytes read from a file (or a channel) at a time."""

MAX_NAME_BYTES = 1024
MAX_COMPONENT_BYTES = 255
CHANNEL_NAME = "polymux-file"
"""Name of the channels the sender opens (the file name travels in the offer)."""

BUSY_WAIT = 10.0
"""Seconds an offer waits for an earlier transfer of the same file to end (a sender that
resumes on a new connection may be faster than the old connection's end reaching us: a
server reading a connection with no credit on the wire sees its end only after the data
before it); then it is refused as busy (a sender with retries tries again later)."""

TAKEOVER_IDLE = 5.0
"""Seconds an earlier transfer of the same file from the same host must have received
nothing before a new offer takes its place: the sender came back on a new connection
while the old one is not known to be dead yet (a silent cut is noticed only after the
keepalive's bound), so the old transfer is ended at once, its partial file kept, and the
new one resumes from it."""

REPLY_TIMEOUT = 60.0
"""Seconds the sender waits for each answer of the receiver (the accept, after which it
may have hashed a large partial file, and the final confirmation)."""

DEFAULT_RETRIES = 10
"""Reconnections a sender makes after its connection is lost (``--retries``), waiting
:func:`backoff` before each; 0 gives up at the first loss."""

BACKOFF_FIRST = 0.5
"""Seconds before the first reconnection (at most: see :func:`backoff`)."""

BACKOFF_CAP = 30.0
"""The longest wait between two reconnections, in seconds."""

RETRYABLE = frozenset({"connection", "timeout", "busy", "failed", "checksum"})
"""Failure codes (:attr:`Transfer.code`) that another attempt may cure: the connection
was lost or timed out, the receiver still held an earlier transfer of the file, or the
file changed while it was sent. Not: ``unsafe-name``, ``too-large``, ``protocol`` (the
receiver's answer would be the same) and ``local`` (the file cannot be read here)."""

_DRIVE = re.compile(r"^[A-Za-z]:")


class UnsafeName(ValueError):
    """A file name the receiver refuses (it could escape the target directory)."""


class TransferError(Exception):
    """One file's transfer failed (refused, interrupted, or not verified)."""

    def __init__(self, message: str, code: str = "failed") -> None:
        super().__init__(message)
        self.code = code
        """``unsafe-name``, ``busy``, ``too-large``, ``checksum``, ``protocol``, ``failed``."""


# -- path safety ---------------------------------------------------------------------------


def check_name(name: object) -> PurePosixPath:
    """Return ``name`` as a relative path, or raise :class:`UnsafeName` saying why."""
    if not isinstance(name, str):
        raise UnsafeName(f"the name must be a string, got {type(name).__name__}")
    if not name:
        raise UnsafeName("the name is empty")
    if "\0" in name:
        raise UnsafeName("the name contains a NUL byte")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise UnsafeName("the name contains a control character")
    if "\\" in name:
        raise UnsafeName("the name contains a backslash (the separator is '/')")
    if name.startswith("/"):
        raise UnsafeName("the name is an absolute path")
    if _DRIVE.match(name):
        raise UnsafeName("the name starts with a drive letter")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise UnsafeName(f"the name is longer than {MAX_NAME_BYTES} bytes")
    parts = name.split("/")
    for part in parts:
        if not part:
            raise UnsafeName("the name has an empty component ('//' or a trailing '/')")
        if part in (".", ".."):
            raise UnsafeName(f"the name has a {part!r} component")
        if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            raise UnsafeName(f"a component of the name is longer than {MAX_COMPONENT_BYTES} bytes")
    if name.endswith(PART_SUFFIX):
        raise UnsafeName(f"names ending in {PART_SUFFIX!r} are reserved for partial files")
    return PurePosixPath(*parts)


def destination(root: Path, name: object) -> Path:
    """The path ``name`` is written to under ``root``; raises :class:`UnsafeName` if the
    name is unsafe or the path resolves outside ``root`` (through a symlink, say)."""
    relative = check_name(name)
    base = root.resolve()
    target = base.joinpath(*relative.parts)
    resolved = target.resolve()
    if resolved == base or not resolved.is_relative_to(base):
        raise UnsafeName("the name resolves outside the target directory")
    return target


# -- the receiver --------------------------------------------------------------------------


@dataclass
class ReceiverStats:
    """What a :class:`Receiver` did so far."""

    files: int = 0
    unchanged: int = 0
    refused: int = 0
    interrupted: int = 0
    failed: int = 0
    bytes: int = 0


class Receiver:
    """Receives files into ``root``: use :meth:`handle` as the channel handler of a
    polymux server (or of a client session the sender connects to).

    ``log(line)`` gets one line per file (received, refused, interrupted, failed).
    ``max_size`` refuses larger files. ``on_file(name, size, offer, peer)`` is called for
    each file received and verified (not for one that was there unchanged), with the
    sender's offer record (any extra fields it carried) and its address.
    """

    def __init__(
        self,
        root: Path,
        *,
        log: Callable[[str], None] | None = None,
        max_size: int | None = None,
        on_file: Callable[[str, int, dict[str, Any], str], None] | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.log = log or (lambda line: print(line, flush=True))
        self.max_size = max_size
        self.on_file = on_file
        self.stats = ReceiverStats()
        """Counters of what happened."""
        self._busy: dict[Path, _Active] = {}  # the transfers under way, by target

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Receive one file from one channel."""
        peer = _peer(writer)
        try:
            await self._receive(reader, writer, peer)
        except TransferError as exc:
            with contextlib.suppress(ConnectionError, PolymuxError):
                write_record(writer, {"type": "error", "code": exc.code, "message": str(exc)})
                await writer.drain()
        except (RecordError, ConnectionError, PolymuxError) as exc:
            self.stats.failed += 1
            self.log(f"failed: channel from {peer}: {exc}")
        finally:
            writer.close()

    async def _receive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        offer = await read_record(reader)
        if offer is None:
            return
        if offer["type"] != "offer":
            raise TransferError(f"expected an offer, got {offer['type']!r}", "protocol")
        name = offer.get("name")
        try:
            target = destination(self.root, name)
        except UnsafeName as exc:
            self.stats.refused += 1
            self.log(f"refused: {name!r} from {peer}: {exc}")
            raise TransferError(f"unsafe name {name!r}: {exc}", "unsafe-name") from None
        assert isinstance(name, str)
        size = field(offer, "size", int)
        if size < 0 or (self.max_size is not None and size > self.max_size):
            self.stats.refused += 1
            self.log(f"refused: {name!r} from {peer}: size {size} not allowed")
            raise TransferError(f"{name!r}: size {size} is over the limit", "too-large")
        await self._wait_for_earlier(target, name, peer)
        active = self._busy[target] = _Active(_host(peer), writer)
        try:
            fresh = await self._receive_into(reader, writer, peer, name, size, target, active)
        finally:
            del self._busy[target]
            active.done.set()
        if fresh and self.on_file is not None:
            self.on_file(name, size, offer, peer)

    async def _wait_for_earlier(self, target: Path, name: str, peer: str) -> None:
        """An earlier transfer of ``target`` is under way: wait for its end, up to
        :data:`BUSY_WAIT`; take its place at once if it is the same host's and has received
        nothing for :data:`TAKEOVER_IDLE` (the sender is back on a new connection). Raises
        ``busy`` if it still runs then."""
        loop = asyncio.get_running_loop()
        until = loop.time() + BUSY_WAIT
        while (earlier := self._busy.get(target)) is not None:
            idle = loop.time() - earlier.progress_at
            if earlier.host == _host(peer) and idle >= TAKEOVER_IDLE and not earlier.taken_over:
                earlier.taken_over = True
                self.log(
                    f"taking over: {name} from {peer}: the earlier transfer from the same host has "
                    f"received nothing for {idle:.0f} s (its connection is gone)"
                )
                earlier.writer.transport.abort()  # its reader fails; its partial file is kept
            left = until - loop.time()
            if left <= 0:
                self.stats.refused += 1
                self.log(f"refused: {name!r} from {peer}: already being received")
                raise TransferError(
                    f"{name!r} is already being received (an earlier transfer still runs after "
                    f"{BUSY_WAIT:g} s)",
                    "busy",
                )
            with contextlib.suppress(TimeoutError):
                # (again at TAKEOVER_IDLE: the earlier may go quiet meanwhile)
                wait = max(0.05, min(left, TAKEOVER_IDLE - idle if idle < TAKEOVER_IDLE else left))
                async with asyncio.timeout(wait):
                    await earlier.done.wait()

    async def _receive_into(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
        name: str,
        size: int,
        target: Path,
        active: _Active,
    ) -> bool:
        """Receive into ``target``; True for a new file (False: it was there unchanged)."""
        part = target.with_name(target.name + PART_SUFFIX)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.parent.resolve().is_relative_to(self.root):
            raise TransferError(f"refused {name!r}: its directory resolves outside the target", "unsafe-name")
        # What we have already: a partial file, or the whole file.
        have, existing = 0, False
        digest = hashlib.sha256()
        if _is_regular(part):
            have = min(part.stat().st_size, size)
            await asyncio.to_thread(_hash_prefix, part, have, digest)  # large: off the loop
        elif _is_regular(target) and target.stat().st_size == size:  # noqa: ASYNC240
            have, existing = size, True
            await asyncio.to_thread(_hash_prefix, target, size, digest)
        write_record(
            writer, {"type": "accept", "offset": have, "prefix_sha256": digest.hexdigest() if have else ""}
        )
        await writer.drain()
        start_record = await read_record(reader)
        if start_record is None or start_record["type"] != "start":
            raise TransferError("expected a start record", "protocol")
        offset = field(start_record, "offset", int)
        if offset not in (0, have):
            raise TransferError(f"start offset {offset} is neither 0 nor the offered {have}", "protocol")
        if offset == 0:
            digest = hashlib.sha256()
        unchanged = existing and offset == size
        received = 0
        if not unchanged:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                os.ftruncate(fd, offset)
                os.lseek(fd, offset, os.SEEK_SET)
                remaining = size - offset
                loop = asyncio.get_running_loop()
                while remaining:
                    try:
                        chunk = await reader.read(min(CHUNK, remaining))
                    except (ConnectionError, PolymuxError) as exc:
                        self._interrupted(name, peer, offset + received, size, str(exc))
                        raise TransferError(f"interrupted: {exc}") from None
                    if not chunk:
                        self._interrupted(name, peer, offset + received, size, "the sender ended early")
                        raise TransferError("the data ended early", "protocol")
                    _write_all(fd, chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    remaining -= len(chunk)
                    active.progress_at = loop.time()
            finally:
                os.close(fd)
        end = await read_record(reader)
        if end is None or end["type"] != "end":
            raise TransferError("expected an end record", "protocol")
        expected = field(end, "sha256", str)
        actual = digest.hexdigest()
        if expected != actual:
            self.stats.failed += 1
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
            self.log(
                f"failed: {name!r} from {peer}: SHA-256 mismatch (sender {expected[:16]}, got {actual[:16]})"
            )
            raise TransferError(f"SHA-256 mismatch on {name!r}: the receiver got {actual}", "checksum")
        if not unchanged:
            os.replace(part, target)
        write_record(writer, {"type": "done", "sha256": actual, "resumed_from": offset})
        await writer.drain()
        self.stats.bytes += received
        if unchanged:
            self.stats.unchanged += 1
            self.log(f"unchanged: {name} ({format_bytes(size)}, sha256 {actual[:16]}) from {peer}")
        else:
            self.stats.files += 1
            note = f", resumed at {format_bytes(offset)}" if offset else ""
            self.log(f"received: {name} ({format_bytes(size)}, sha256 {actual[:16]} ok{note}) from {peer}")
        return not unchanged

    def _interrupted(self, name: str, peer: str, have: int, size: int, why: str) -> None:
        self.stats.interrupted += 1
        self.log(
            f"interrupted: {name} from {peer} at {format_bytes(have)} of {format_bytes(size)} "
            f"({why}); kept {name}{PART_SUFFIX} for resume"
        )


class _Active:
    """A transfer under way: ``done`` is set when it ends; ``progress_at``: when its last
    bytes arrived (loop time)."""

    def __init__(self, host: str, writer: asyncio.StreamWriter) -> None:
        self.host = host
        self.writer = writer
        self.done = asyncio.Event()
        self.progress_at = asyncio.get_running_loop().time()
        self.taken_over = False


def _host(peer: str) -> str:
    """The host part of a peer label (``host:port``; a unix socket's label as it is)."""
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return str(peer) if peer else "unix socket"


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _hash_prefix(path: Path, n: int, digest: Any) -> None:
    with open(path, "rb") as f:
        while n > 0:
            chunk = f.read(min(CHUNK, n))
            if not chunk:
                break
            digest.update(chunk)
            n -= len(chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# -- the sender ----------------------------------------------------------------------------


@dataclass
class Transfer:
    """One file to send, and how its transfer went."""

    path: Path
    """The local file."""
    name: str
    """The name the receiver gets (a relative path)."""
    size: int = 0
    done: int = 0
    """Bytes the receiver holds so far (resumed bytes count)."""
    sent: int = 0
    """Bytes sent in this run."""
    resumed_from: int = 0
    status: str = "waiting"
    """``waiting``, ``sending``, ``done``, ``unchanged`` or ``failed``."""
    error: str | None = None
    code: str = ""
    """Why it failed: a :class:`TransferError` code, ``connection`` (the session or the
    channel was lost) or ``local`` (the file could not be read)."""
    sha256: str = ""
    started: float = 0.0
    finished: float = 0.0
    extra: dict[str, Any] = dc_field(default_factory=dict)


class RateLimiter:
    """Shared bandwidth limit (bytes per second) over all channels."""

    def __init__(self, rate: float) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        self.rate = rate
        self._next = 0.0

    async def take(self, n: int) -> None:
        """Wait until ``n`` more bytes fit within the rate."""
        now = time.monotonic()
        start = max(self._next, now)
        self._next = start + n / self.rate
        if start > now:
            await asyncio.sleep(start - now)


def collect(paths: Iterable[Path], *, name: str | None = None) -> list[Transfer]:
    """Transfers for files and the regular files under directories (named relative to
    the directory given). ``name`` renames a single file.

    Raises:
        FileNotFoundError: a path that is neither a file nor a directory (an input that
            cannot be read: exit status 1 in the commands).
        ValueError: ``name`` with anything but one file (a usage error: exit status 2).
    """
    transfers: list[Transfer] = []
    paths = list(paths)
    if name is not None and (len(paths) != 1 or not paths[0].is_file()):
        raise ValueError("--as NAME needs exactly one file")
    for path in paths:
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
            transfers.extend(Transfer(f, f.relative_to(path).as_posix(), f.stat().st_size) for f in files)
        elif path.is_file():
            transfers.append(Transfer(path, name if name is not None else path.name, path.stat().st_size))
        else:
            raise FileNotFoundError(errno.ENOENT, "no such file or directory", str(path))
    return transfers


async def send_file(
    session: Session,
    transfer: Transfer,
    *,
    progress: Callable[[Transfer], None] | None = None,
    limiter: RateLimiter | None = None,
) -> Transfer:
    """Send one file on a new channel; fills in ``transfer`` (status, sha256, error)."""
    transfer.status = "sending"
    transfer.error, transfer.code = None, ""
    if not transfer.started:
        transfer.started = time.perf_counter()
    writer: asyncio.StreamWriter | None = None
    try:
        # A pair of streams on one-way formats (omnistreams): a transfer talks both ways.
        async with asyncio.timeout(REPLY_TIMEOUT):
            reader, writer = await session.open_pair(CHANNEL_NAME)
        await _send(reader, writer, transfer, progress, limiter)
    except (TransferError, RecordError, ConnectionError, PolymuxError, OSError) as exc:
        transfer.status = "failed"
        transfer.error = str(exc) or type(exc).__name__
        transfer.code = _code(exc)
        if writer is not None:
            writer.transport.abort()
    else:
        writer.close()
    transfer.finished = time.perf_counter()
    if progress is not None:
        progress(transfer)
    return transfer


def _code(exc: BaseException) -> str:
    """The failure code of a transfer that raised ``exc`` (:attr:`Transfer.code`)."""
    if isinstance(exc, TransferError):
        return exc.code
    if isinstance(exc, RecordError):
        return "protocol"
    if isinstance(exc, (ConnectionError, PolymuxError)):
        return "connection"
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "local"  # an OSError reading the file


async def _send(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    t: Transfer,
    progress: Callable[[Transfer], None] | None,
    limiter: RateLimiter | None,
) -> None:
    write_record(writer, {"type": "offer", "name": t.name, "size": t.size})
    await writer.drain()
    reply = await _answer(reader, writer, "the offer of " + t.name)
    if reply is None:
        raise TransferError("the receiver closed the channel without an answer")
    if reply["type"] == "error":
        raise TransferError(f"refused by the receiver: {reply.get('message')}", str(reply.get("code")))
    if reply["type"] != "accept":
        raise TransferError(f"expected accept, got {reply['type']!r}", "protocol")
    have = field(reply, "offset", int)
    prefix = field(reply, "prefix_sha256", str)
    if not 0 <= have <= t.size:
        raise TransferError(f"the receiver offered offset {have} for a {t.size}-byte file", "protocol")
    digest = hashlib.sha256()
    # File I/O stays on the loop: reads of CHUNK bytes from the page cache take
    # microseconds, less than a thread hop.
    with open(t.path, "rb") as f:  # noqa: ASYNC230
        start = 0
        if have:
            await asyncio.to_thread(_hash_stream, f, have, digest)  # large: off the loop
            if digest.hexdigest() == prefix:
                start = have
            else:  # the receiver's partial is not a prefix of this file: from the start
                digest = hashlib.sha256()
                f.seek(0)
        write_record(writer, {"type": "start", "offset": start})
        t.resumed_from = t.done = start
        if progress is not None:
            progress(t)
        remaining = t.size - start
        while remaining:
            chunk = f.read(min(CHUNK, remaining))
            if not chunk:
                raise TransferError(f"{t.path} shrank while being sent")
            digest.update(chunk)
            if limiter is not None:
                await limiter.take(len(chunk))
            writer.write(chunk)
            await writer.drain()
            remaining -= len(chunk)
            t.sent += len(chunk)
            t.done += len(chunk)
            if progress is not None:
                progress(t)
    t.sha256 = digest.hexdigest()
    write_record(writer, {"type": "end", "sha256": t.sha256})
    writer.write_eof()
    await writer.drain()
    reply = await _answer(reader, writer, "the end of " + t.name)
    if reply is None:
        raise TransferError("the receiver closed the channel without confirming")
    if reply["type"] == "error":
        raise TransferError(f"the receiver reports: {reply.get('message')}", str(reply.get("code")))
    if reply["type"] != "done" or reply.get("sha256") != t.sha256:
        raise TransferError(f"not confirmed: {reply!r}", "checksum")
    t.status = "unchanged" if start == t.size and t.size and t.sent == 0 else "done"


async def _answer(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, what: str
) -> dict[str, Any] | None:
    """The receiver's next record, within :data:`REPLY_TIMEOUT`; a wait past it fails the
    transfer with what was waited for and, where the format holds answers back, why."""
    try:
        async with asyncio.timeout(REPLY_TIMEOUT):
            return await read_record(reader)
    except TimeoutError:
        protocol = writer.get_extra_info("protocol_name") or ""
        hint = ""
        option = formats.get(protocol).caps.conversation_option if protocol in formats.PROTOCOLS else None
        if option is not None:
            hint = (
                f" ({protocol} holds an answer until the request ends unless the receiver sets "
                f"{option}=True, as polymux's file receivers do: is the receiver started without it?)"
            )
        raise TransferError(
            f"no answer from the receiver to {what} within {REPLY_TIMEOUT:g} s{hint}", "timeout"
        ) from None


def _hash_stream(f: IO[bytes], n: int, digest: Any) -> None:
    while n > 0:
        chunk = f.read(min(CHUNK, n))
        if not chunk:
            break
        digest.update(chunk)
        n -= len(chunk)


async def send_files(
    session: Session,
    transfers: list[Transfer],
    *,
    parallel: int = 8,
    progress: Callable[[Transfer], None] | None = None,
    limiter: RateLimiter | None = None,
) -> list[Transfer]:
    """Send ``transfers``, at most ``parallel`` at a time (one channel each)."""
    gate = asyncio.Semaphore(parallel)

    async def one(t: Transfer) -> Transfer:
        async with gate:
            return await send_file(session, t, progress=progress, limiter=limiter)

    return list(await asyncio.gather(*(one(t) for t in transfers)))


def summary(transfers: list[Transfer], elapsed: float, parallel: int, reconnects: int = 0) -> str:
    """The one-line summary: files, bytes, seconds, MB/s, resumed, unchanged, failed (and
    the reconnections, if any)."""
    sent = sum(t.sent for t in transfers)
    total = sum(t.size for t in transfers)
    resumed = [t for t in transfers if t.resumed_from and t.status == "done"]
    unchanged = sum(t.status == "unchanged" for t in transfers)
    failed = sum(t.status == "failed" for t in transfers)
    ok = sum(t.status in ("done", "unchanged") for t in transfers)
    rate = sent / elapsed / 1e6 if elapsed > 0 else 0.0
    return (
        f"{ok}/{len(transfers)} files verified (SHA-256), {format_bytes(total)} in all; sent "
        f"{format_bytes(sent)} in {elapsed:.2f} s = {rate:.1f} MB/s, up to {parallel} channels at once; "
        f"resumed {len(resumed)} ({format_bytes(sum(t.resumed_from for t in resumed))} not re-sent), "
        f"unchanged {unchanged}, failed {failed}"
        + (f"; reconnected {reconnects} time{'s' if reconnects != 1 else ''}" if reconnects else "")
    )


# -- progress ------------------------------------------------------------------------------


class PlainProgress:
    """Progress as plain lines (no TTY): one line every ``interval`` seconds, and one per
    file that ends."""

    def __init__(
        self,
        transfers: list[Transfer],
        *,
        interval: float = 0.5,
        out: IO[str] | None = None,
        cut: Callable[[], bool] | None = None,
        will_retry: Callable[[Transfer], bool] | None = None,
    ) -> None:
        self.transfers = transfers
        self.interval = interval
        self.out = out or sys.stdout
        self.cut = cut
        self.will_retry = will_retry
        self._task: asyncio.Task[None] | None = None
        self._start = time.perf_counter()
        self._reported: dict[int, str] = {}  # the last end reported of each transfer

    def __enter__(self) -> Self:
        self._start = time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        self._line()

    def update(self, t: Transfer) -> None:
        """A transfer made progress (or ended)."""
        if t.status in ("done", "unchanged", "failed") and self._reported.get(id(t)) != t.status:
            self._reported[id(t)] = t.status  # (a failed transfer that is retried ends again)
            if t.status == "failed" and self.cut is not None and self.cut():
                # Cut on purpose (the demo's --interrupt): not an error, a partial file.
                line = f"  cut       {t.name} at {format_bytes(t.done)} of {format_bytes(t.size)}"
                print(line, file=self.out, flush=True)
            elif t.status == "failed" and self.will_retry is not None and self.will_retry(t):
                line = (
                    f"  interrupted {t.name} at {format_bytes(t.done)} of {format_bytes(t.size)}: "
                    f"{t.error} (resumed on the next attempt)"
                )
                print(line, file=self.out, flush=True)
            elif t.status == "failed":
                print(f"  FAILED    {t.name}: {t.error}", file=self.out, flush=True)
            else:
                note = f" (resumed at {format_bytes(t.resumed_from)})" if t.resumed_from and t.sent else ""
                print(f"  {t.status:<9} {t.name} {format_bytes(t.size)}{note}", file=self.out, flush=True)

    def reconnecting(self, attempt: int, retries: int, delay: float, why: str, *, same: bool = False) -> None:
        """Files failed (``why``): attempt ``attempt`` of ``retries`` comes in ``delay``
        seconds, on a new connection (``same``: on the one still open)."""
        what = "retrying" if same else "reconnecting"
        line = f"{what} (attempt {attempt}/{retries}, next in {delay:.1f} s): {why}"
        print(line, file=self.out, flush=True)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self._line()

    def _line(self) -> None:
        total = sum(t.size for t in self.transfers) or 1
        done = sum(t.done for t in self.transfers)
        sent = sum(t.sent for t in self.transfers)
        complete = sum(t.status in ("done", "unchanged") for t in self.transfers)
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        print(
            f"progress {100 * done / total:5.1f}% {format_bytes(done)} of {format_bytes(total)}, "
            f"{complete}/{len(self.transfers)} files, {sent / elapsed / 1e6:.1f} MB/s",
            file=self.out,
            flush=True,
        )


class RichProgress:
    """Progress bars (rich): one per file and one for the total, each with its average
    throughput (MB/s, as in the summary)."""

    def __init__(
        self,
        transfers: list[Transfer],
        *,
        cut: Callable[[], bool] | None = None,
        will_retry: Callable[[Transfer], bool] | None = None,
    ) -> None:
        require("rich", "--progress rich (progress bars)")
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
        from rich.table import Column

        self.transfers = transfers
        self.cut = cut
        self.will_retry = will_retry
        self.progress = Progress(
            TextColumn("{task.description:<22.22}"),
            # The bar takes what the terminal leaves; the figures never wrap onto a second line.
            BarColumn(bar_width=None),
            DownloadColumn(binary_units=True, table_column=Column(no_wrap=True, min_width=17)),
            TextColumn("{task.fields[speed]:>10}", table_column=Column(no_wrap=True)),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            refresh_per_second=8,
        )
        self.total = self.progress.add_task(
            "[bold]total",
            total=sum(t.size for t in transfers) or 1,
            status=f"0/{len(transfers)} files",
            speed="",
        )
        self.tasks = {
            id(t): self.progress.add_task(t.name, total=t.size or 1, status="", speed="") for t in transfers
        }
        self._start = time.perf_counter()

    def __enter__(self) -> Self:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.refresh()
        self.progress.stop()

    def update(self, t: Transfer) -> None:
        """A transfer made progress (or ended)."""
        status = {"done": "[green]ok", "unchanged": "[cyan]unchanged", "failed": "[red]FAILED"}.get(
            t.status, ""
        )
        if t.status == "failed" and self.cut is not None and self.cut():
            status = "[yellow]cut"
        elif t.status == "failed" and self.will_retry is not None and self.will_retry(t):
            status = "[yellow]interrupted"
        if t.resumed_from and t.status in ("sending", "done"):
            status = (status + " " if status else "") + f"[yellow]resumed@{format_bytes(t.resumed_from)}"
        now = time.perf_counter()
        end = t.finished if t.finished else now
        speed = _rate(t.sent, end - t.started) if t.sent else ""
        self.progress.update(self.tasks[id(t)], completed=t.done, status=status, speed=speed)
        complete = sum(x.status in ("done", "unchanged") for x in self.transfers)
        self.progress.update(
            self.total,
            completed=sum(x.done for x in self.transfers),
            status=f"{complete}/{len(self.transfers)} files",
            speed=_rate(sum(x.sent for x in self.transfers), now - self._start),
        )

    def reconnecting(self, attempt: int, retries: int, delay: float, why: str, *, same: bool = False) -> None:
        """Files failed (``why``): attempt ``attempt`` of ``retries`` comes in ``delay``
        seconds, on a new connection (``same``: on the one still open); the total's status,
        and a line above the bars."""
        what = "retrying" if same else "reconnecting"
        text = f"{what} (attempt {attempt}/{retries}, next in {delay:.1f} s)"
        self.progress.update(self.total, status=f"[yellow]{text}")
        self.progress.console.print(f"{text}: {why}", markup=False, highlight=False)


def _rate(n: int, seconds: float) -> str:
    """``n`` bytes over ``seconds`` in MB/s (10^6 bytes per second), for display."""
    return f"{n / seconds / 1e6:.1f} MB/s" if seconds > 0 else ""


def make_progress(
    transfers: list[Transfer],
    mode: str = "auto",
    *,
    cut: Callable[[], bool] | None = None,
    will_retry: Callable[[Transfer], bool] | None = None,
) -> PlainProgress | RichProgress | None:
    """``auto`` (rich on a terminal, plain lines otherwise or without the ``apps`` extra),
    ``rich``, ``plain`` or ``none``. While ``cut()`` is true, failed transfers are shown as
    cut on purpose (partial files to resume), not as errors; so is a failed transfer for
    which ``will_retry(transfer)`` is true (another attempt follows)."""
    if mode == "none":
        return None
    if mode == "auto" and sys.stdout.isatty():
        try:
            return RichProgress(transfers, cut=cut, will_retry=will_retry)
        except ModuleNotFoundError:  # rich is the `apps` extra: plain lines without it
            return PlainProgress(transfers, cut=cut, will_retry=will_retry)
    if mode == "rich":
        return RichProgress(transfers, cut=cut, will_retry=will_retry)
    return PlainProgress(transfers, cut=cut, will_retry=will_retry)


async def send_with_progress(
    session: Session,
    transfers: list[Transfer],
    *,
    parallel: int = 8,
    progress: str = "auto",
    limiter: RateLimiter | None = None,
    on_progress: Callable[[Transfer], None] | None = None,
    cut: Callable[[], bool] | None = None,
) -> float:
    """Send ``transfers`` showing progress (``make_progress`` modes); return the seconds.
    ``on_progress(transfer)`` is called too, after the display; ``cut()`` tells the
    display that the connection was cut on purpose."""
    view = make_progress(transfers, progress, cut=cut)
    callbacks = [f for f in (view.update if view is not None else None, on_progress) if f is not None]

    def report(t: Transfer) -> None:
        for callback in callbacks:
            callback(t)

    start = time.perf_counter()
    with view if view is not None else contextlib.nullcontext():
        await send_files(
            session, transfers, parallel=parallel, progress=report if callbacks else None, limiter=limiter
        )
    return time.perf_counter() - start


# -- reconnecting --------------------------------------------------------------------------


def backoff(
    attempt: int,
    rng: random.Random | None = None,
    *,
    first: float = BACKOFF_FIRST,
    cap: float = BACKOFF_CAP,
) -> float:
    """Seconds to wait before reconnection ``attempt`` (1, 2 ...): a random time between
    half and all of ``min(cap, first * 2 ** (attempt - 1))``, so that senders cut at the
    same moment (a server restart) do not all come back at once."""
    ceiling = min(cap, first * 2 ** (attempt - 1))
    return (rng or random).uniform(ceiling / 2, ceiling)


@dataclass
class SendResult:
    """What :func:`send_with_retries` did."""

    elapsed: float
    """Seconds from the first attempt to the end."""
    reconnects: int = 0
    """Attempts after the first (each after a :func:`backoff` wait)."""
    gave_up: str | None = None
    """Why the retries stopped before they were spent (``give_up``'s answer: the peer
    speaks another format, say), or None."""


def _pending(transfers: list[Transfer]) -> list[Transfer]:
    """What another attempt would send: not verified, and not failed for good."""
    return [
        t
        for t in transfers
        if t.status not in ("done", "unchanged") and (t.status != "failed" or t.code in RETRYABLE)
    ]


async def send_with_retries(
    connect: Callable[[], Awaitable[Session]],
    transfers: list[Transfer],
    *,
    retries: int = DEFAULT_RETRIES,
    parallel: int = 8,
    progress: str = "auto",
    limiter: RateLimiter | None = None,
    on_progress: Callable[[Transfer], None] | None = None,
    give_up: Callable[[Session], str | None] | None = None,
    rng: random.Random | None = None,
) -> SendResult:
    """Send ``transfers`` over sessions from ``connect()``, resuming after each loss.

    The first session is the caller's to get: what ``connect()`` raises then propagates
    (there is nothing to resume). When files fail for a reason another attempt may cure
    (:data:`RETRYABLE`: the connection was lost or timed out, the receiver still held an
    earlier transfer of the file), the session is dropped if it is gone, and after
    :func:`backoff` a new one is made (a connection that fails counts as an attempt too),
    up to ``retries`` times; each file resumes from the offset the receiver reports (its
    partial file), until every file is verified or the retries are spent. The display
    (``make_progress`` modes) says ``reconnecting (attempt 3/10, next in 2.1 s)``.
    ``give_up(session)``, called after an attempt in which files failed, may name a reason
    to stop (the peer never spoke the format). ``retries=0``: one attempt, as
    :func:`send_with_progress`.
    """
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries!r}")
    session: Session | None = await connect()
    reconnects = 0
    gave_up: str | None = None

    def will_retry(t: Transfer) -> bool:
        return gave_up is None and reconnects < retries and t.code in RETRYABLE

    view = make_progress(transfers, progress, will_retry=will_retry)
    callbacks = [f for f in (view.update if view is not None else None, on_progress) if f is not None]

    def report(t: Transfer) -> None:
        for callback in callbacks:
            callback(t)

    start = time.perf_counter()
    why = ""
    try:
        with view if view is not None else contextlib.nullcontext():
            while True:
                if session is not None:
                    await send_files(
                        session,
                        _pending(transfers),
                        parallel=parallel,
                        progress=report if callbacks else None,
                        limiter=limiter,
                    )
                    failed = [t for t in transfers if t.status == "failed"]
                    if failed and give_up is not None and (gave_up := give_up(session)) is not None:
                        break
                    why = next((t.error or "" for t in failed if t.code in RETRYABLE), why)
                    if session.is_closed:
                        session.abort()
                        session = None
                if not _pending(transfers) or reconnects >= retries:
                    break
                reconnects += 1
                delay = backoff(reconnects, rng)
                if view is not None:
                    view.reconnecting(
                        reconnects, retries, delay, why or "files failed", same=session is not None
                    )
                await asyncio.sleep(delay)
                if session is None:
                    try:
                        session = await connect()
                    except (NoSession, OSError, PolymuxError) as exc:  # (TimeoutError too)
                        why = str(exc) or type(exc).__name__
    finally:
        if session is not None:
            await session.aclose()
    return SendResult(time.perf_counter() - start, reconnects, gave_up)
