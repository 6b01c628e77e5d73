"""polymux in web pages: ``omnistreams.js``, an ES module that speaks omnistreams over the
browser's ``WebSocket``, and a way to serve it next to a polymux WebSocket server.

The module ships inside the package (:func:`client_path`, :func:`client_source`); its API
is described in ``docs/browser.md``. :func:`static_files` answers plain HTTP ``GET``
requests on the same port as :func:`polymux.serve_websocket`, so one server gives a page,
its scripts and the WebSocket its channels run on::

    from polymux.web import static_files

    server = await polymux.serve_websocket(
        handler, "127.0.0.1", 8000, process_request=static_files({"/": Path("index.html")})
    )
    # the page: <script type="module"> import { connect } from '/polymux/omnistreams.js' ...

This package imports ``websockets`` only inside :func:`static_files`' request handler.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import urlsplit


if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection
    from websockets.http11 import Request, Response


__all__ = ["CLIENT_URL", "StaticSource", "client_path", "client_source", "static_files"]

CLIENT_URL = "/polymux/omnistreams.js"
"""Where :func:`static_files` serves ``omnistreams.js`` unless told otherwise."""

_CLIENT = "omnistreams.js"

_TYPES = {".js": "text/javascript", ".mjs": "text/javascript", ".html": "text/html", ".css": "text/css"}


def client_path() -> Path:
    """The file ``omnistreams.js`` inside the installed package."""
    return Path(str(resources.files(__name__).joinpath(_CLIENT)))


def client_source() -> bytes:
    """The bytes of ``omnistreams.js`` (serve them as ``text/javascript``)."""
    return resources.files(__name__).joinpath(_CLIENT).read_bytes()


def _content_type(name: str) -> str:
    suffix = Path(name).suffix.lower()
    kind = _TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"
    return f"{kind}; charset=utf-8" if kind.startswith("text/") else kind


StaticSource: TypeAlias = Path | bytes | Callable[[], bytes]
"""What :func:`static_files` serves at a path: a file, bytes, or a function returning bytes."""


def static_files(
    files: Mapping[str, StaticSource] | None = None,
    *,
    client_url: str | None = CLIENT_URL,
    same_origin: bool = True,
) -> Callable[[ServerConnection, Request], Response | None]:
    """A ``process_request`` hook for :func:`polymux.serve_websocket` that serves a few files.

    Args:
        files: URL path (``"/"``, ``"/chat.js"``) -> a file (read at each request, so edits
            show at the next reload), its bytes, or a function called at each request
            (a status page, say; the type comes from the path's suffix, e.g. ``.json``).
            Only these exact paths are served (the query string is ignored); nothing is
            looked up on disk from the request.
        client_url: where to serve ``omnistreams.js`` (``None``: not at all).
        same_origin: refuse (403) a WebSocket upgrade whose ``Origin`` header names
            another site than the ``Host`` it was sent to. Browsers let any page open a
            WebSocket to any server (no CORS), so without this a page from elsewhere,
            open in the same browser, could use the server as if it were ours. Clients
            that send no ``Origin`` (polymux, Node) are not affected.

    Returns:
        A callable for ``process_request=``: a WebSocket upgrade goes through to the
        session (unless refused as above); a ``GET`` of a known path gets the file (``Cache-Control: no-cache``,
        the content type from its suffix); any other path gets a 404. A file that cannot
        be read gets a 500 naming it. Meant for a page's few files: bulk data belongs on
        channels, where credit bounds memory.
    """
    table: dict[str, StaticSource] = dict(files or {})
    if client_url is not None:
        table[client_url] = client_path()
    for url in table:
        if not url.startswith("/"):
            raise ValueError(f"static_files: URL paths start with '/', got {url!r}")

    def process_request(connection: ServerConnection, request: Request) -> Response | None:
        from websockets.datastructures import Headers
        from websockets.http11 import Response

        if request.headers.get("Upgrade", "").lower() == "websocket":
            origin = request.headers.get("Origin")
            if same_origin and origin is not None and urlsplit(origin).netloc != request.headers.get("Host"):
                return connection.respond(403, f"cross-origin WebSocket refused: Origin {origin}\n")
            return None
        path = request.path.split("?", 1)[0]
        source = table.get(path)
        if source is None:
            return connection.respond(404, f"not found: {path}\n")
        name = path if path != "/" and "." in path.rsplit("/", 1)[-1] else "index.html"
        if isinstance(source, Path):
            name = source.name
            try:
                body = source.read_bytes()
            except OSError as exc:
                return connection.respond(500, f"cannot read {source}: {exc.strerror}\n")
        elif isinstance(source, bytes):
            body = source
        else:
            body = source()
        headers = Headers(
            [
                ("Content-Type", _content_type(name)),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-cache"),
                ("X-Content-Type-Options", "nosniff"),
                ("Connection", "close"),
            ]
        )
        return Response(200, "OK", headers, body)

    return process_request
