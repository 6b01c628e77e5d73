"""What the kernel holds of a socket's bytes (for liveness: a ping still in our send queue
has not reached the peer), and the TCP keepalive the drivers set on the connections polymux
makes and accepts."""

from __future__ import annotations

import math
import socket
import sys
from typing import Any

from polymux.config import SessionConfig


__all__ = ["TCP_KEEPALIVE_PROBES", "kernel_unsent", "tcp_keepalive"]

TCP_KEEPALIVE_PROBES = 3
"""Unanswered TCP keepalive probes after which the kernel drops the connection."""


def tcp_keepalive(sock: Any, config: SessionConfig) -> bool:
    """Turn on TCP keepalive on ``sock`` (a TCP socket; anything else is left alone) with
    the session's keepalive timings: the first probe after ``keepalive_interval`` seconds
    with nothing received, then one every ``keepalive_timeout / 3`` seconds, and the
    connection is dropped after :data:`TCP_KEEPALIVE_PROBES` unanswered ones: a peer whose
    host or path is gone (a dropped Wi-Fi link, a NAT that forgot the connection) is
    noticed within interval + timeout even when the peer speaks a format without pings and
    sends no heartbeats. Any live host answers the probes, so an honest peer is never cut.
    ``keepalive_interval=None`` leaves the socket as it is. True when it was set."""
    interval = config.keepalive_interval
    if interval is None or sock is None:
        return False
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return False
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        every = max(1, math.ceil(config.keepalive_timeout / TCP_KEEPALIVE_PROBES))
        for name, value in (
            ("TCP_KEEPIDLE", max(1, math.ceil(interval))),
            ("TCP_KEEPINTVL", every),
            ("TCP_KEEPCNT", TCP_KEEPALIVE_PROBES),
        ):
            option = getattr(socket, name, None)
            if option is not None:  # (macOS has no TCP_KEEPIDLE: its default idle time)
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    except (OSError, AttributeError, ValueError, TypeError):
        return False  # a socket that cannot say (a pipe's pseudo-socket): the session's own rules
    return True


if sys.platform == "linux":
    import fcntl
    import termios

    def kernel_unsent(sock: Any) -> int:
        """Bytes in a socket's kernel send queue that the peer has not taken yet (Linux
        ``SIOCOUTQ``, on TCP and unix stream sockets); 0 where it cannot be read."""
        if sock is None:
            return 0
        try:
            buf = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
        except (OSError, ValueError, AttributeError, TypeError):
            return 0
        return max(0, int.from_bytes(buf, sys.byteorder, signed=True))

else:

    def kernel_unsent(sock: Any) -> int:
        """0: the kernel's send queue is read on Linux only."""
        return 0
