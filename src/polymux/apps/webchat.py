"""The chat and the file transfer in a web page: one server for terminals and browsers.

A page (``examples/chat/web/``) connects with ``omnistreams.js`` over WebSocket and opens
one channel pair (:meth:`polymux.Session.open_pair`) per room and per transfer; the same
:class:`~polymux.apps.chat.ChatServer` serves terminal clients on TCP or unix sockets, so
both meet in the same rooms. Channels by name (records: :mod:`polymux.apps.records`)::

    chat/<room>   the chat records of polymux.apps.chat (join, say, leave / welcome, msg ...)
    files/put     an upload, the records of polymux.apps.filetransfer (offer, accept, start,
                  the bytes, end {sha256}, done): the receiver of examples/filetransfer, with
                  its path safety, SHA-256 check and resume
    files/get     a download: get {name} -> file {name, size}, the bytes, end {sha256};
                  or error {message}
    files/list    list {} -> files {files: [{name, size}]}

A download writes one chunk at a time and waits on ``drain()``: a page that stops reading
stops granting credit, and the server stops reading the file (:meth:`WebChat.stats` shows
each download's bytes sent and whether it waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from polymux.apps.chat import CHANNEL_PREFIX, ChatServer
from polymux.apps.common import format_bytes
from polymux.apps.filetransfer import CHUNK, PART_SUFFIX, Receiver, UnsafeName, destination
from polymux.apps.records import RecordError, encode_record, field, read_record, write_record
from polymux.exceptions import PolymuxError


__all__ = ["MAX_LISTED", "Download", "WebChat"]

MAX_LISTED = 1000
"""Files listed at most (``files/list``)."""


@dataclass
class Download:
    """One download in progress."""

    id: int
    name: str
    size: int
    transport: Any
    """The channel's transport (its write buffer holds what has no credit yet)."""
    sent: int = 0
    """Bytes read from the file and written to the channel."""
    records: int = 0
    """Bytes of records written to the channel before the file's bytes."""
    waiting: bool = False
    """True while the writer waits on ``drain()`` (the page is not reading fast enough)."""

    def as_dict(self) -> dict[str, Any]:
        """The download as JSON-able values; ``buffered``: bytes written to the channel and
        still in its write buffer (no credit for them yet); ``on_wire``: all the others,
        records included (what the page has received, or will once they arrive)."""
        buffered = self.transport.get_write_buffer_size()
        return {
            "id": self.id,
            "name": self.name,
            "size": self.size,
            "sent": self.sent,
            "buffered": buffered,
            "on_wire": self.records + self.sent - buffered,
            "waiting": self.waiting,
        }


class WebChat:
    """The channel handler of the web page's channels (see the module docstring).

    Args:
        chat: the chat server shared with the terminal clients.
        root: uploads land here, downloads come from here.
        max_upload: largest upload accepted (bytes; ``None``: no limit).
        log: gets one line per transfer and refusal (default: print).
    """

    def __init__(
        self,
        chat: ChatServer,
        root: Path,
        *,
        max_upload: int | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.chat = chat
        self.log = log or (lambda line: print(line, flush=True))
        self.receiver = Receiver(root, log=self.log, max_size=max_upload)
        self.root = self.receiver.root
        self.downloads: dict[int, Download] = {}
        """Downloads in progress, by id."""
        self.served = 0
        """Downloads completed."""
        self._ids = itertools.count(1)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one channel of a page, by its name."""
        name = writer.get_extra_info("channel_name") or ""
        if name.startswith(CHANNEL_PREFIX):
            await self.chat.handle(reader, writer)
        elif name == "files/put":
            await self.receiver.handle(reader, writer)
        elif name in ("files/get", "files/list"):
            try:
                await (self._get if name == "files/get" else self._list)(reader, writer)
            except (RecordError, ConnectionError, PolymuxError, OSError) as exc:
                self.log(f"failed: {name}: {exc}")
                with contextlib.suppress(ConnectionError, PolymuxError):
                    write_record(writer, {"type": "error", "message": str(exc)})
                    await writer.drain()
            finally:
                writer.close()
        else:
            self.log(f"refused: a channel named {name!r} (expected chat/<room> or files/...)")
            transport: Any = writer.transport
            transport.reset(f"unknown channel {name!r}")

    async def _list(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_record(reader)
        if request is None or request["type"] != "list":
            raise RecordError(f"expected a list record, got {request and request['type']!r}")
        files = await asyncio.to_thread(self.listing)
        write_record(writer, {"type": "files", "files": files})
        await writer.drain()

    def listing(self) -> list[dict[str, Any]]:
        """The files under the root (names relative to it, sorted; at most ``MAX_LISTED``),
        without partial uploads and symlinks."""
        found: list[dict[str, Any]] = []
        for path in sorted(self.root.rglob("*")):
            if len(found) >= MAX_LISTED:
                break
            if path.name.endswith(PART_SUFFIX):
                continue
            try:
                info = path.lstat()
            except OSError:
                continue  # gone meanwhile
            if stat.S_ISREG(info.st_mode):
                found.append({"name": path.relative_to(self.root).as_posix(), "size": info.st_size})
        return found

    async def _get(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_record(reader)
        if request is None or request["type"] != "get":
            raise RecordError(f"expected a get record, got {request and request['type']!r}")
        name = field(request, "name", str)
        try:
            path = destination(self.root, name)
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except (UnsafeName, OSError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            self.log(f"refused: download of {name!r}: {why}")
            write_record(writer, {"type": "error", "message": f"cannot send {name!r}: {why}"})
            await writer.drain()
            return
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError(f"{name!r} is not a regular file")
            head = encode_record({"type": "file", "name": name, "size": size})
            writer.write(head)
            download = Download(next(self._ids), name, size, writer.transport, records=len(head))
            self.downloads[download.id] = download
            try:
                digest = await self._send_bytes(f, writer, download)
            finally:
                del self.downloads[download.id]
        write_record(writer, {"type": "end", "sha256": digest})
        writer.write_eof()
        await writer.drain()
        self.served += 1
        self.log(f"sent: {name} ({format_bytes(size)}, sha256 {digest[:16]})")

    async def _send_bytes(self, f: Any, writer: asyncio.StreamWriter, download: Download) -> str:
        """Read the file a chunk at a time, each chunk only once the channel drained: the
        page's credit paces the disk reads, so memory stays at one window and one chunk.
        Reads stay on the loop (page-cache reads of one chunk take microseconds)."""
        digest = hashlib.sha256()
        remaining = download.size
        while remaining:
            chunk = f.read(min(CHUNK, remaining))
            if not chunk:
                raise OSError(f"{download.name!r} shrank while being sent")
            digest.update(chunk)
            writer.write(chunk)
            download.sent += len(chunk)
            remaining -= len(chunk)
            download.waiting = True
            await writer.drain()
            download.waiting = False
        return digest.hexdigest()

    def stats(self) -> dict[str, Any]:
        """Rooms and members, downloads in progress, downloads completed (``served``),
        upload counters and the process's resident memory (``rss``, bytes, Linux; ``None``
        elsewhere): what ``/stats.json`` of the example server shows."""
        return {
            "rooms": {room: sorted(members) for room, members in self.chat.rooms.items()},
            "downloads": [d.as_dict() for d in self.downloads.values()],
            "served": self.served,
            "uploads": asdict(self.receiver.stats),
            "rss": _rss(),
        }


def _rss() -> int | None:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
