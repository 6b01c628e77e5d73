"""The chat and the file transfer in a web page: one server for terminals and browsers.

A page (``polymux/apps/web/``, inside the package) connects with ``omnistreams.js`` over WebSocket and opens
one channel pair (:meth:`polymux.Session.open_pair`) per room and per transfer; the same
:class:`~polymux.apps.chat.ChatServer` serves terminal clients on TCP or unix sockets, so
both meet in the same rooms. Channels by name (records: :mod:`polymux.apps.records`)::

    chat/<room>   the chat records of polymux.apps.chat (join, say, leave / welcome, msg ...)
    files/put     an upload, the records of polymux.apps.filetransfer (offer, accept, start,
                  the bytes, end {sha256}, done): the receiver of examples/filetransfer, with
                  its path safety, SHA-256 check and resume. An offer that also names a
                  room and a nick of the same connection ({name, size, room, nick}) makes
                  the room tell its members about the new file (a chat ``file`` record)
    files/get     a download: get {name, offset?} -> file {name, size, offset}, the bytes
                  from offset, end {sha256 of the whole file}; or error {message}. A page
                  whose download was cut asks for the rest with offset
    files/list    list {} -> files {files: [{name, size}], truncated}
    files/watch   watch {} -> files {...} at once and again after each upload, until the
                  page ends or cancels its side (a live file list)

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
from polymux.exceptions import PolymuxError, SessionClosed


__all__ = ["MAX_LISTED", "MAX_LISTING_BYTES", "WEB_PAGE", "Download", "WebChat"]

WEB_PAGE = Path(__file__).resolve().parent / "web"
"""The web page's files (``index.html``, ``chat.js``, ...), shipped inside the package."""

MAX_LISTED = 1000
"""Files listed at most (``files/list``, ``files/watch``)."""

MAX_LISTING_BYTES = 48 * 1024
"""Names listed at most, in UTF-8 bytes (the listing is one record, of at most 64 KiB)."""


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
    offset: int = 0
    """Where the download started (a page resuming a cut download asks for the rest)."""

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
            "offset": self.offset,
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
        self.receiver = Receiver(root, log=self.log, max_size=max_upload, on_file=self._on_file)
        self.root = self.receiver.root
        self.downloads: dict[int, Download] = {}
        """Downloads in progress, by id."""
        self.served = 0
        """Downloads completed."""
        self.watchers = 0
        """Pages watching the file list (``files/watch``)."""
        self._ids = itertools.count(1)
        self._changed: asyncio.Future[None] | None = None
        self._listing: asyncio.Future[dict[str, Any]] | None = None

    def changed(self) -> None:
        """The files changed: every ``files/watch`` channel gets the new list."""
        self._listing = None
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
        self._changed = None

    def _on_file(self, name: str, size: int, offer: dict[str, Any], peer: str) -> None:
        room, nick = offer.get("room"), offer.get("nick")
        if isinstance(room, str) and isinstance(nick, str):
            member = self.chat.rooms.get(room, {}).get(nick)
            if member is not None and member.peer == peer:  # only for the uploader's own nick
                self.chat.post_file(room, nick, name, size)
        self.changed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one channel of a page, by its name."""
        name = writer.get_extra_info("channel_name") or ""
        if name.startswith(CHANNEL_PREFIX):
            await self.chat.handle(reader, writer)
        elif name == "files/put":
            await self.receiver.handle(reader, writer)
        elif name in ("files/get", "files/list", "files/watch"):
            serve = {"files/get": self._get, "files/list": self._list, "files/watch": self._watch}[name]
            try:
                await serve(reader, writer)
            except SessionClosed as exc:
                if exc.__cause__ is not None:  # not a page that closed (a tab, a reload)
                    self.log(f"failed: {name}: {exc}")
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
        self._listing = None  # asked for: look again (files may come by other ways than uploads)
        write_record(writer, {"type": "files", **await self._current_listing()})
        await writer.drain()

    async def _watch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The file list now and after each change, until the page ends its side (or the
        channel or the session goes). One listing at a time per page: a page that does not
        read gets no more than one record ahead (the writer waits on ``drain()``)."""
        request = await read_record(reader)
        if request is None or request["type"] != "watch":
            raise RecordError(f"expected a watch record, got {request and request['type']!r}")
        gone: asyncio.Future[Any] = asyncio.ensure_future(reader.read(1))  # the page's end, cancel or more
        self.watchers += 1
        try:
            while not gone.done():
                if self._changed is None:
                    self._changed = asyncio.get_running_loop().create_future()
                changed: asyncio.Future[Any] = self._changed
                write_record(writer, {"type": "files", **await self._current_listing()})
                await writer.drain()
                await asyncio.wait({gone, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.watchers -= 1
            gone.cancel()
            with contextlib.suppress(BaseException):
                await gone

    async def _current_listing(self) -> dict[str, Any]:
        """The listing, made once per change however many pages ask."""
        if self._listing is None:
            self._listing = asyncio.ensure_future(asyncio.to_thread(self.listing_record))
        listing = self._listing
        try:
            return await asyncio.shield(listing)
        except OSError:
            if self._listing is listing:
                self._listing = None
            raise

    def listing_record(self) -> dict[str, Any]:
        """``{files: [{name, size}], truncated}``: the files under the root (names relative
        to it, sorted; at most ``MAX_LISTED`` files and ``MAX_LISTING_BYTES`` of names),
        without partial uploads and symlinks; ``truncated`` if some were left out."""
        found: list[dict[str, Any]] = []
        names = 0
        truncated = False
        for path in sorted(self.root.rglob("*")):
            if path.name.endswith(PART_SUFFIX):
                continue
            try:
                info = path.lstat()
            except OSError:
                continue  # gone meanwhile
            if stat.S_ISREG(info.st_mode):
                name = path.relative_to(self.root).as_posix()
                names += len(name.encode("utf-8", "surrogateescape")) + 16
                if len(found) >= MAX_LISTED or names > MAX_LISTING_BYTES:
                    truncated = True
                    break
                found.append({"name": name, "size": info.st_size})
        return {"files": found, "truncated": truncated}

    def listing(self) -> list[dict[str, Any]]:
        """The files of :meth:`listing_record`."""
        files: list[dict[str, Any]] = self.listing_record()["files"]
        return files

    async def _get(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_record(reader)
        if request is None or request["type"] != "get":
            raise RecordError(f"expected a get record, got {request and request['type']!r}")
        name = field(request, "name", str)
        offset = request.get("offset", 0)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise RecordError(f"record 'get': field 'offset' must be an int >= 0, got {offset!r}")
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
            if offset > size:
                raise OSError(f"cannot resume {name!r} at byte {offset:,}: it has {size:,} bytes now")
            digest = hashlib.sha256()
            if offset:  # the end record's SHA-256 covers the whole file: hash what the page has
                await asyncio.to_thread(_hash_head, f, offset, digest)
            head = encode_record({"type": "file", "name": name, "size": size, "offset": offset})
            writer.write(head)
            download = Download(
                next(self._ids), name, size, writer.transport, records=len(head), offset=offset
            )
            self.downloads[download.id] = download
            try:
                await self._send_bytes(f, writer, download, digest)
            finally:
                del self.downloads[download.id]
        write_record(writer, {"type": "end", "sha256": digest.hexdigest()})
        writer.write_eof()
        await writer.drain()
        self.served += 1
        note = f", resumed at {format_bytes(offset)}" if offset else ""
        self.log(f"sent: {name} ({format_bytes(size)}, sha256 {digest.hexdigest()[:16]}{note})")

    async def _send_bytes(
        self, f: Any, writer: asyncio.StreamWriter, download: Download, digest: Any
    ) -> None:
        """Read the file from the download's offset a chunk at a time, each chunk only once
        the channel drained: the page's credit paces the disk reads, so memory stays at one
        window and one chunk. Reads stay on the loop (page-cache reads of one chunk take
        microseconds)."""
        remaining = download.size - download.offset
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

    def stats(self) -> dict[str, Any]:
        """Rooms and members, downloads in progress, downloads completed (``served``),
        upload counters, pages watching the file list and the process's resident memory (``rss``, bytes, Linux; ``None``
        elsewhere): what ``/stats.json`` of the example server shows."""
        return {
            "rooms": {room: sorted(members) for room, members in self.chat.rooms.items()},
            "downloads": [d.as_dict() for d in self.downloads.values()],
            "served": self.served,
            "uploads": asdict(self.receiver.stats),
            "watchers": self.watchers,
            "rss": _rss(),
        }


def _hash_head(f: Any, n: int, digest: Any) -> None:
    """Hash the first ``n`` bytes of ``f`` into ``digest``; leave ``f`` at byte ``n``."""
    f.seek(0)
    while n > 0:
        chunk = f.read(min(CHUNK, n))
        if not chunk:
            raise OSError("the file shrank while being hashed")
        digest.update(chunk)
        n -= len(chunk)


def _rss() -> int | None:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
