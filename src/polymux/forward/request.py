"""The lines two polymux forwarders exchange at the start of a channel, and the reply codes.

A channel that is not bare starts with one request line (at most :data:`MAX_LINE`
bytes, ASCII, ending in ``\\n``)::

    PMXF/1 CONNECT <host> <port>       near -> far: connect this channel to host:port
    PMXF/1 CONTROL                     near -> far: the session's control channel
    PMXF/1 ACCEPTED <id> <host> <port> far -> near: a connection to -R listener <id> came from host:port

answered by one line, before any byte of the connection::

    OK [<host> <port>]                 done (CONNECT: the far end's side of the target connection)
    ERR <code> <text>                  refused; <code> is a SOCKS5 reply code (RFC 1928)

On the control channel (kept open for the session's life) the near end then sends
``LISTEN <id> <host> <port>`` and ``UNLISTEN <id>``; the far end answers
``LISTENING <id> <host> <port>`` or ``REFUSED <id> <code> <text>``.

On formats with channel names such a channel is also named :data:`MARK`, so that a far
end with ``--to`` tells bare channels from requests by the name alone. Pure codec: no I/O.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from enum import IntEnum

from polymux.forward.spec import HostPort, _host, _port


__all__ = [
    "MARK",
    "MAX_LINE",
    "VERSION",
    "ForwardError",
    "Reply",
    "Request",
    "code_for",
    "control_line",
    "format_reply",
    "parse_control",
    "parse_reply",
    "parse_request",
]

VERSION = "PMXF/1"
"""The first word of every request line."""
MARK = "polymux-forward"
"""The channel name of requests on formats with names."""
MAX_LINE = 1024
"""The longest request, reply or control line, ``\\n`` included (bytes)."""


class Reply(IntEnum):
    """Reply codes: those of SOCKS5 (RFC 1928, section 6), also used between forwarders."""

    SUCCEEDED = 0
    GENERAL_FAILURE = 1
    NOT_ALLOWED = 2
    NETWORK_UNREACHABLE = 3
    HOST_UNREACHABLE = 4
    CONNECTION_REFUSED = 5
    TTL_EXPIRED = 6
    COMMAND_NOT_SUPPORTED = 7
    ADDRESS_TYPE_NOT_SUPPORTED = 8

    @property
    def text(self) -> str:
        """What the code means, in words."""
        return _TEXT[self]


_TEXT = {
    Reply.SUCCEEDED: "succeeded",
    Reply.GENERAL_FAILURE: "general failure",
    Reply.NOT_ALLOWED: "not allowed by the far end's rules",
    Reply.NETWORK_UNREACHABLE: "network unreachable",
    Reply.HOST_UNREACHABLE: "host unreachable",
    Reply.CONNECTION_REFUSED: "connection refused",
    Reply.TTL_EXPIRED: "timed out",
    Reply.COMMAND_NOT_SUPPORTED: "command not supported",
    Reply.ADDRESS_TYPE_NOT_SUPPORTED: "address type not supported",
}


class ForwardError(Exception):
    """A forward failed: a refused target, a request the peer did not understand, no
    session. ``code`` is the :class:`Reply` that says why (for a SOCKS client)."""

    def __init__(self, message: str, code: Reply = Reply.GENERAL_FAILURE) -> None:
        super().__init__(message)
        self.code = code
        """Why, as a reply code."""


def code_for(error: BaseException) -> Reply:
    """The reply code for a failed connection attempt."""
    if isinstance(error, ForwardError):
        return error.code
    if isinstance(error, TimeoutError):
        return Reply.TTL_EXPIRED
    if isinstance(error, socket.gaierror):
        return Reply.HOST_UNREACHABLE  # the name does not resolve
    if isinstance(error, ConnectionRefusedError):
        return Reply.CONNECTION_REFUSED
    if isinstance(error, OSError):
        if error.errno == errno.ENETUNREACH:
            return Reply.NETWORK_UNREACHABLE
        if error.errno in (errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.EADDRNOTAVAIL):
            return Reply.HOST_UNREACHABLE
        if error.errno == errno.ECONNREFUSED:
            return Reply.CONNECTION_REFUSED
        if error.errno == errno.ETIMEDOUT:
            return Reply.TTL_EXPIRED
    return Reply.GENERAL_FAILURE


@dataclass(frozen=True, slots=True)
class Request:
    """A parsed request line."""

    verb: str
    """``CONNECT``, ``CONTROL`` or ``ACCEPTED``."""
    target: HostPort | None = None
    """CONNECT: the target; ACCEPTED: where the connection came from."""
    listener: int = 0
    """ACCEPTED: the id of the ``-R`` listener."""

    def encode(self) -> bytes:
        """The line, ``\\n`` included."""
        words = [VERSION, self.verb]
        if self.verb == "ACCEPTED":
            words.append(str(self.listener))
        if self.target is not None:
            words += [self.target.host, str(self.target.port)]
        line = (" ".join(words) + "\n").encode("ascii")
        if len(line) > MAX_LINE:
            raise ValueError(f"forward request longer than {MAX_LINE} bytes: {line[:60]!r}...")
        return line


def _text(line: bytes, what: str) -> list[str]:
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise ForwardError(f"{what}: not a line of at most {MAX_LINE} bytes: {line[:60]!r}")
    try:
        text = line[:-1].rstrip(b"\r").decode("ascii")
    except UnicodeDecodeError:
        raise ForwardError(f"{what}: not ASCII: {line[:60]!r}") from None
    if not text.isprintable():
        raise ForwardError(f"{what}: control characters in {line[:60]!r}")
    return text.split(" ")


def parse_request(line: bytes) -> Request:
    """The request ``line`` holds (``\\n`` included).

    Raises:
        ForwardError: naming what is wrong (a request of another kind, a version polymux
            does not speak, a malformed target); its code is the reply to send.
    """
    words = _text(line, "forward request")
    if words[0] != VERSION:
        raise ForwardError(f"not a polymux forward request: {line[:60]!r}", Reply.COMMAND_NOT_SUPPORTED)
    verb, args = (words[1] if len(words) > 1 else ""), words[2:]
    try:
        if verb == "CONNECT" and len(args) == 2:
            host = _host(args[0], "CONNECT")
            return Request(verb, HostPort(host, _port(args[1], "CONNECT", zero=False)))
        if verb == "CONTROL" and not args:
            return Request(verb)
        if verb == "ACCEPTED" and len(args) == 3 and args[0].isdigit():
            # The peer address as the far end's socket gave it (an IPv6 one may carry a %scope).
            where = HostPort(args[1], _port(args[2], "ACCEPTED", zero=True))
            return Request(verb, where, int(args[0]))
    except ValueError as exc:
        raise ForwardError(f"forward request: {exc}", Reply.ADDRESS_TYPE_NOT_SUPPORTED) from None
    raise ForwardError(f"unknown forward request {' '.join(words[:2])!r}", Reply.COMMAND_NOT_SUPPORTED)


def format_reply(code: Reply, text: str = "", where: HostPort | None = None) -> bytes:
    """A reply line: ``OK [host port]`` for :attr:`Reply.SUCCEEDED`, else ``ERR code text``
    (the text cut to fit the line, newlines replaced)."""
    if code == Reply.SUCCEEDED:
        line = "OK" if where is None else f"OK {where.host} {where.port}"
        return (line + "\n").encode("ascii")
    clean = "".join(c if c.isprintable() else " " for c in (text or code.text))
    encoded = f"ERR {int(code)} {clean}".encode("ascii", "replace")[: MAX_LINE - 1]
    return encoded + b"\n"


def parse_reply(line: bytes) -> HostPort | None:
    """The far end's answer: where it connected from (``OK host port``), or None for a bare
    ``OK``.

    Raises:
        ForwardError: an ``ERR`` reply (with its code and text), or a line that is not a
            reply at all (a far end that does not speak forward requests on this channel).
    """
    words = _text(line, "forward reply")
    if words[0] == "OK":
        if len(words) == 3 and words[2].isdigit():
            return HostPort(words[1], int(words[2]))
        if len(words) == 1:
            return None
    elif words[0] == "ERR" and len(words) >= 2 and words[1].isdigit():
        try:
            code = Reply(int(words[1]))
        except ValueError:
            code = Reply.GENERAL_FAILURE
        text = " ".join(words[2:]) or code.text
        raise ForwardError(text, code if code != Reply.SUCCEEDED else Reply.GENERAL_FAILURE)
    raise ForwardError(f"not a forward reply: {line[:60]!r}")


CONTROL_VERBS = {"LISTEN": 3, "UNLISTEN": 1, "LISTENING": 3, "REFUSED": None}
"""Control lines and their number of words after the verb (None: at least 2)."""


def parse_control(line: bytes) -> tuple[str, list[str]]:
    """A control line: its verb and words (``REFUSED``'s text is one last word).

    Raises:
        ForwardError: a line that is not a control line.
    """
    words = _text(line, "control line")
    verb, args = words[0], words[1:]
    if verb not in CONTROL_VERBS or not args or not args[0].isdigit():
        raise ForwardError(f"not a control line: {line[:60]!r}", Reply.COMMAND_NOT_SUPPORTED)
    count = CONTROL_VERBS[verb]
    if count is None:
        if len(args) < 2 or not args[1].isdigit():
            raise ForwardError(f"not a control line: {line[:60]!r}", Reply.COMMAND_NOT_SUPPORTED)
        return verb, [args[0], args[1], " ".join(args[2:])]
    if len(args) != count:
        raise ForwardError(f"not a control line: {line[:60]!r}", Reply.COMMAND_NOT_SUPPORTED)
    return verb, args


def control_line(verb: str, *words: object) -> bytes:
    """A control line of ``verb`` and ``words`` (text cut to fit :data:`MAX_LINE`)."""
    text = " ".join([verb, *(str(w) for w in words)])
    clean = "".join(c if c.isprintable() else " " for c in text)
    return clean.encode("ascii", "replace")[: MAX_LINE - 1] + b"\n"
