"""Sans-I/O codecs, one module per wire format. No I/O, no asyncio."""

from __future__ import annotations

from polymux.formats import PROTOCOLS


__all__ = ["PROTOCOLS"]
