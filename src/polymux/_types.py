"""Shared type aliases."""

from __future__ import annotations

from typing import TypeAlias


BytesLike: TypeAlias = bytes | bytearray | memoryview
"""What polymux accepts wherever it takes bytes."""
