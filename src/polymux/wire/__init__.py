"""Sans-I/O codecs, one module per wire format. No I/O, no asyncio; this package imports
nothing above it (the formats they are codecs of are :mod:`polymux.formats`)."""

from __future__ import annotations
