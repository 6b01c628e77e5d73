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

Against DNS rebinding, :func:`static_files` answers only requests sent to host names it
knows (the loopback names, the address the request arrived on, and ``allowed_hosts``): a
page of another site whose name an attacker made resolve to 127.0.0.1 sends its own name
in ``Host`` and gets a 421, for the page, its data and the WebSocket alike.

This package imports ``websockets`` only inside :func:`static_files`' request handler.
"""

from __future__ import annotations

import ipaddress
import mimetypes
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import urlsplit


if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection
    from websockets.http11 import Request, Response


__all__ = [
    "CLIENT_URL",
    "StaticSource",
    "client_path",
    "client_source",
    "host_allowed",
    "static_files",
]

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


def _hostname(host: str) -> str | None:
    """The host name of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lower
    case and without a trailing dot; ``None`` if it is not one."""
    try:
        split = urlsplit("//" + host)
        name = split.hostname
        split.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return None
    if not name or any(c.isspace() or c in "/?#@" for c in host):
        return None
    return name.rstrip(".") if name != "." else None


def _loopback(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def host_allowed(host: str | None, local_address: str | None, allowed: Iterable[str] = ()) -> bool:
    """Whether a request whose ``Host`` header is ``host`` is meant for this server.

    True for a loopback name or address (``localhost``, names under ``.localhost``,
    127.0.0.0/8, ``::1``), for ``local_address`` (the address the request arrived on:
    what a client that typed our address sends), and for the names in ``allowed``
    (compared without case, port or trailing dot; ``"*"`` allows every host). False for a
    missing or malformed ``Host``. The port is not compared: DNS rebinding keeps it.
    """
    names = {_hostname(name) or name.lower() for name in allowed}
    if "*" in names:
        return True
    name = _hostname(host) if host is not None else None
    if name is None:
        return False
    if _loopback(name) or name in names:
        return True
    if local_address is None:
        return False
    try:
        return ipaddress.ip_address(name) == ipaddress.ip_address(local_address.split("%", 1)[0])
    except ValueError:
        return False


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
    allowed_hosts: Iterable[str] = (),
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
        allowed_hosts: host names (or addresses) this server answers besides the loopback
            names and the address a request arrived on (:func:`host_allowed`); ``"*"``
            answers any (only behind a proxy that checks ``Host`` itself). Every request,
            the page, its data and the WebSocket upgrade, sent to another name gets a 421
            (Misdirected Request): under DNS rebinding a page of another site reaches
            127.0.0.1 under its own name, and the ``Origin`` check alone cannot tell (the
            attacker controls both headers).

    Returns:
        A callable for ``process_request=``: a request to a host name not allowed gets a
        421 (see ``allowed_hosts``); a WebSocket upgrade goes through to the
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
    hosts = tuple(allowed_hosts) if not isinstance(allowed_hosts, str) else (allowed_hosts,)
    for name in hosts:
        if name != "*" and _hostname(name) is None:
            raise ValueError(f"static_files: not a host name: {name!r}")

    def process_request(connection: ServerConnection, request: Request) -> Response | None:
        from websockets.datastructures import Headers
        from websockets.http11 import Response

        host = request.headers.get("Host")
        local = connection.transport.get_extra_info("sockname")
        if not host_allowed(host, local[0] if isinstance(local, tuple) else None, hosts):
            return connection.respond(421, f"this server does not answer for host {host!r}\n")
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
