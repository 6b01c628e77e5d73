"""The sans-I/O session core (:class:`SessionCore`) under the asyncio and anyio drivers."""

from __future__ import annotations

from polymux.session import events
from polymux.session.budget import MemoryAccount
from polymux.session.core import CoreChannel, NoRoomToOpen, SessionCore


__all__ = ["CoreChannel", "MemoryAccount", "NoRoomToOpen", "SessionCore", "events"]
