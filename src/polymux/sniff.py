"""Telling a peer that speaks no multiplexing format at all from its first bytes: HTTP
(requests, responses, the HTTP/2 preface and SETTINGS frame), TLS records and SSH banners,
the usual things found listening on a port that was meant for a polymux peer. Pure bytes
in, a description out; the session core uses it to say what the peer probably speaks when
its first bytes break the format, and :mod:`polymux.tracing.diagnose` to say what a command
met.

Every signature here is many fixed bytes long (a protocol name and version, a record header
with a version and a bounded length), so a match is near certain; anything else is left to
the multiplexing formats' own detector (:func:`polymux.tracing.detect`)."""

from __future__ import annotations

import re
from dataclasses import dataclass


__all__ = ["Foreign", "identify", "show"]


@dataclass(frozen=True, slots=True)
class Foreign:
    """A protocol that is not a multiplexing format, recognised from its first bytes."""

    name: str
    """``"HTTP"``, ``"HTTP/2"``, ``"TLS"`` or ``"SSH"``."""
    what: str
    """What was seen, in words (``'an HTTP response "HTTP/1.1 400 Bad Request"'``)."""
    peer: str
    """What the peer then is (``"an HTTP server"``)."""
    advice: str
    """What to try."""


_METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT", b"TRACE")
_HTTP_RESPONSE = re.compile(rb"^HTTP/\d(?:\.\d)? \d{3}(?: [^\r\n]*)?(?:\r?\n|$)")
_HTTP_REQUEST = re.compile(rb"^(?:" + b"|".join(_METHODS) + rb") (\S+) HTTP/\d(?:\.\d)?(?:\r?\n|$)")
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_TLS_TYPES = {0x14: "change_cipher_spec", 0x15: "alert", 0x16: "handshake", 0x17: "application_data"}
_TLS_HANDSHAKES = {1: "ClientHello", 2: "ServerHello", 4: "NewSessionTicket", 11: "Certificate"}
_TLS_ALERTS = {
    10: "unexpected_message",
    20: "bad_record_mac",
    22: "record_overflow",
    40: "handshake_failure",
    42: "bad_certificate",
    47: "illegal_parameter",
    50: "decode_error",
    70: "protocol_version",
    80: "internal_error",
    109: "missing_extension",
    112: "unrecognized_name",
    116: "certificate_required",
    120: "no_application_protocol",
}
_SSH_BANNER = re.compile(rb"^SSH-(\d\.\d+)-([\x21-\x7e]+)")


def show(data: bytes, limit: int = 48) -> str:
    """``data`` for people: its first line in quotes when it is text, else its first bytes
    in hex (``"HTTP/1.1 400 Bad Request"``, ``00 03 00 00 ...``)."""
    head = data[:limit]
    line = head.split(b"\n")[0].rstrip(b"\r")
    if line and all(32 <= b < 127 or b == 9 for b in line):
        more = "..." if len(line) < len(data.split(b"\n")[0].rstrip(b"\r")) else ""
        return '"' + line.decode("ascii").replace('"', '\\"') + more + '"'
    shown = head[:16].hex(" ")
    return shown + (" ..." if len(data) > 16 else "")


def _first_line(data: bytes) -> str:
    return data.split(b"\n")[0].rstrip(b"\r")[:80].decode("ascii", "replace")


def identify(data: bytes) -> Foreign | None:
    """The non-multiplexing protocol whose first bytes ``data`` are, or None."""
    if _HTTP_RESPONSE.match(data):
        return Foreign(
            "HTTP",
            f'an HTTP response "{_first_line(data)}"',
            "an HTTP server",
            "point it at a polymux peer's port (a WebSocket endpoint takes a ws:// URL: "
            "polymux.connect_websocket)",
        )
    if data.lstrip()[:16].lower().startswith((b"<!doctype html", b"<html>", b"<html ")):
        return Foreign(
            "HTTP",
            f"an HTML page, {show(data.lstrip())} (an HTTP server's answer without a status line, as to "
            "HTTP/0.9)",
            "an HTTP server",
            "point it at a polymux peer's port",
        )
    if match := _HTTP_REQUEST.match(data):
        websocket = b"\nupgrade: websocket" in data.lower()
        what = f"an HTTP request ({data.split(b' ')[0].decode()} {match.group(1)[:60].decode('ascii', 'replace')})"
        if websocket:
            return Foreign(
                "HTTP",
                what.replace("an HTTP request", "a WebSocket handshake"),
                "a WebSocket client",
                "serve WebSocket clients with polymux.serve_websocket (or a ws:// bridge endpoint)",
            )
        return Foreign("HTTP", what, "an HTTP client", "point the client at a polymux server of its format")
    if data.startswith(_H2_PREFACE[: max(4, min(len(data), len(_H2_PREFACE)))]) and len(data) >= 4:
        return Foreign(
            "HTTP/2", "the HTTP/2 connection preface", "an HTTP/2 client", "point it at an HTTP/2 server"
        )
    if (
        len(data) >= 9
        and data[3] == 0x04  # SETTINGS
        and data[4] in (0, 1)
        and data[5:9] == b"\0\0\0\0"
        and int.from_bytes(data[:3], "big") % 6 == 0
        and int.from_bytes(data[:3], "big") <= 16384
    ):
        return Foreign(
            "HTTP/2",
            "an HTTP/2 SETTINGS frame (a server's first frame)",
            "an HTTP/2 server",
            "point it at a polymux peer's port",
        )
    if (
        len(data) >= 5
        and data[0] in _TLS_TYPES
        and data[1] == 3
        and data[2] <= 4
        and 0 < int.from_bytes(data[3:5], "big") <= 18432
    ):
        kind = _TLS_TYPES[data[0]]
        if kind == "alert" and len(data) >= 7:
            what = f"a TLS alert ({_TLS_ALERTS.get(data[6], f'code {data[6]}')})"
        elif kind == "handshake" and len(data) >= 6:
            what = f"a TLS {_TLS_HANDSHAKES.get(data[5], 'handshake')} record"
        else:
            what = f"a TLS {kind} record"
        hello = len(data) >= 6 and data[0] == 0x16 and data[5] == 1
        return Foreign(
            "TLS",
            what,
            "a TLS client" if hello else "a TLS server",
            "serve TLS with ssl= (start_server(..., ssl=context))"
            if hello
            else "connect with TLS: polymux.connect(..., ssl=context) (the polymux commands speak plain TCP)",
        )
    if _SSH_BANNER.match(data):
        return Foreign(
            "SSH",
            f'an SSH banner "{_first_line(data)}"',
            "an SSH peer",
            "point it at a polymux peer's port (SSH multiplexes channels of its own; polymux does not speak it)",
        )
    return None
