"""Sans-I/O codecs, one module per wire format. No I/O, no asyncio."""

from __future__ import annotations


__all__ = ["PROTOCOLS"]

PROTOCOLS = (
    "mstream-v1",
    "mstream-v2",
    "mstream-v3",
    "mplex",
    "multiplex",
    "yamux",
    "streamux",
    "omnistreams",
    "omnistreams-legacy",
    "smux",
    "smux-v2",
)
"""Protocol names polymux speaks (``protocol=``)."""
