"""What the kernel holds of a socket's bytes (for liveness: a ping still in our send queue
has not reached the peer)."""

from __future__ import annotations

import sys
from typing import Any


__all__ = ["kernel_unsent"]

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
